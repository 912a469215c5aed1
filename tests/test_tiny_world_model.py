import hashlib

import pytest

from deployments.models.tiny_world_model import WorldModelSpec, make_world_model

pytestmark = pytest.mark.timeout(120)

LAYOUT = [
    "model_index.json",
    "transformer/config.json",
    "transformer/diffusion_pytorch_model.safetensors",
    "vae/config.json",
    "vae/diffusion_pytorch_model.safetensors",
    "text_encoder/config.json",
    "text_encoder/model.safetensors",
    "tokenizer/tokenizer.json",
    "scheduler/scheduler_config.json",
    "camera_adapter/config.json",
    "camera_adapter/diffusion_pytorch_model.safetensors",
]


def digests(root):
    return {p: hashlib.sha256((root / p).read_bytes()).hexdigest() for p in LAYOUT if p.endswith(".safetensors")}


def test_layout_size_and_determinism(tmp_path):
    a = make_world_model(tmp_path / "a", seed=3)
    b = make_world_model(tmp_path / "b", seed=3)
    c = make_world_model(tmp_path / "c", seed=4)
    for p in LAYOUT:
        assert (a / p).is_file(), p
    size = sum(f.stat().st_size for f in a.rglob("*") if f.is_file())
    assert size < 5 * 2**20
    assert digests(a) == digests(b)
    assert digests(a) != digests(c)


def test_image_conditioned_variant_has_the_extra_channels(tmp_path):
    import json

    root = make_world_model(tmp_path / "i2v", WorldModelSpec(image_conditioned=True))
    config = json.loads((root / "transformer" / "config.json").read_text())
    assert config["in_channels"] == 16 + 4 + 16
    assert json.loads((root / "model_index.json").read_text())["_class_name"] == "WanImageToVideoPipeline"


def test_tokenizer_loads_with_auto_tokenizer_and_keeps_prompts_apart(world_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(world_model_dir / "tokenizer")
    a, b = tok("a zebra").input_ids, tok("a zebu").input_ids
    assert a != b and a[-1] == tok.eos_token_id
