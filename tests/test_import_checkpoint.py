"""`rtv import-checkpoint`: a transformer shipped as the causal Wan projects ship it comes back exactly.

The tiny world model's transformer is written back in the original Wan naming
by a map in `tests/wan_layout.py` (the inverse of what diffusers' converter does, not
derived from the importer), wrapped the ways the projects wrap it, and
imported against a copy of the model stripped to a stock base (no AR keys, no
VAE scale factors, no transformer weights). Its rollout must equal the native
one frame for frame.
"""

from __future__ import annotations

import json
import re
import shutil

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from deployments.generation.engine import WorldModelEngine
from deployments.generation.geometry import CheckpointError
from deployments.contract.events import Interaction
from deployments.contract.session_spec import SessionSpec
from deployments.models.wan_import import ImportRequest, import_checkpoint
from wan_layout import make_stock_base, to_original_wan

pytestmark = pytest.mark.timeout(300)

@pytest.fixture(scope="module")
def native_state(world_model_dir):
    return load_file(world_model_dir / "transformer" / "diffusion_pytorch_model.safetensors")


@pytest.fixture(scope="module")
def stock_base(world_model_dir, tmp_path_factory):
    return make_stock_base(world_model_dir, tmp_path_factory.mktemp("base") / "Wan-tiny-Diffusers")


def request(weights, base, output, world_model_dir=None, **kw) -> ImportRequest:
    geometry = {"frames_per_block": 3, "sink_size": 3, "window_frames": 12}
    adapter = {"camera_adapter": world_model_dir / "camera_adapter"} if world_model_dir else {}
    return ImportRequest(weights=weights, base=base, output=output, dtype=torch.float32, **(geometry | adapter | kw))


KEYS = [[Interaction(event_id="k0", actions=(("w",), ("l",), ()))], [Interaction(event_id="k1", actions=(("a",), ("a", "i"), ("s",)))], []]


def frames_of(model_dir) -> list[np.ndarray]:
    engine = WorldModelEngine.from_pretrained(model_dir)
    session = engine.open_session(SessionSpec(prompt="a red fox in snow", height=64, width=96, seed=3))
    out = []
    for events in KEYS:
        for event in events:
            session.submit(event)
        out.append(engine.generate_block(session).frames)
    session.close()
    return out


@pytest.fixture(scope="module")
def native_frames(world_model_dir):
    return frames_of(world_model_dir)


def _prefixed(state, prefix):
    return {prefix + k: v for k, v in state.items()}


WRAPPINGS = {
    # Self-Forcing / CausVid: the EMA generator, keys as their wrapper module names them.
    "generator_ema.pt": lambda s: {"generator_ema": _prefixed(s, "model."), "generator": _prefixed({k: v * 0 for k, v in s.items()}, "model.")},
    "generator.pth": lambda s: {"generator": _prefixed(s, "model._fsdp_wrapped_module."), "optimizer": {"step": torch.tensor(3)}},
    "ddp-compiled.pt": lambda s: _prefixed(s, "module._orig_mod."),
    "top.safetensors": lambda s: _prefixed(s, "model."),
}


@pytest.mark.parametrize("name", sorted(WRAPPINGS))
def test_every_wrapping_imports_to_the_native_rollout(name, native_state, stock_base, world_model_dir, native_frames, tmp_path):
    wrapped = WRAPPINGS[name](to_original_wan(native_state))
    path = tmp_path / name
    save_file(wrapped, path) if name.endswith(".safetensors") else torch.save(wrapped, path)
    report = import_checkpoint(request(path, stock_base, tmp_path / "imported", world_model_dir))
    assert report.converted and report.tensors == len(native_state)
    assert report.geometry["scale_factor_spatial"] == 8 and report.geometry["num_frames_per_block"] == 3
    imported = frames_of(tmp_path / "imported")
    assert len(imported) == len(native_frames)
    for made, native in zip(imported, native_frames):
        np.testing.assert_array_equal(made, native)


def test_key_picks_the_other_generator(native_state, stock_base, world_model_dir, native_frames, tmp_path):
    path = tmp_path / "both.pt"
    torch.save(WRAPPINGS["generator_ema.pt"](to_original_wan(native_state)), path)
    report = import_checkpoint(request(path, stock_base, tmp_path / "raw", world_model_dir, key="generator"))
    assert report.source_key == "generator"
    imported = load_file(tmp_path / "raw" / "transformer" / "diffusion_pytorch_model.safetensors")
    assert all(float(t.abs().max()) == 0 for t in imported.values())


def test_diffusers_naming_and_bfloat16_default(native_state, stock_base, tmp_path):
    path = tmp_path / "diffusers.safetensors"
    save_file(native_state, path)
    out = tmp_path / "bf16"
    report = import_checkpoint(ImportRequest(weights=path, base=stock_base, output=out, frames_per_block=3, sink_size=3, window_frames=12))
    assert not report.converted
    written = load_file(out / "transformer" / "diffusion_pytorch_model.safetensors")
    assert written["blocks.0.attn1.to_q.weight"].dtype == torch.bfloat16
    assert written["scale_shift_table"].dtype == torch.float32  # diffusers keeps it in float32
    config = json.loads((out / "transformer" / "config.json").read_text())
    assert (config["num_frames_per_block"], config["sink_size"], config["sliding_window_num_frames"]) == (3, 3, 12)
    assert not (out / "camera_adapter").exists()
    # Without a camera adapter the imported model refuses keys, by name.
    engine = WorldModelEngine.from_pretrained(out)
    session = engine.open_session(SessionSpec(prompt="x", height=64, width=64))
    with pytest.raises(Exception, match="no camera adapter"):
        session.submit(Interaction(event_id="k", actions=(("w",), (), ())))
    session.close()


def test_schedule_flags_are_written(native_state, stock_base, tmp_path):
    path = tmp_path / "w.safetensors"
    save_file(native_state, path)
    out = tmp_path / "scheduled"
    import_checkpoint(request(path, stock_base, out, shift=5.0, denoising_steps=(1000.0, 750.0, 500.0, 250.0)))
    scheduler = json.loads((out / "scheduler" / "scheduler_config.json").read_text())
    assert scheduler["flow_shift"] == 5.0 and scheduler["denoising_step_list"] == [1000.0, 750.0, 500.0, 250.0]
    # The base's own file is untouched (the output's was a hard link to it).
    assert "denoising_step_list" not in json.loads((stock_base / "scheduler" / "scheduler_config.json").read_text())


def _mutations(state):
    first = "blocks.0.self_attn.q.weight"
    missing = {k: v for k, v in state.items() if k != first}
    extra = dict(state) | {"blocks.0.self_attn.extra.weight": torch.zeros(2)}
    misshapen = dict(state) | {first: torch.zeros(3, 3)}
    return {"missing 1: blocks.0.attn1.to_q.weight": missing, "unexpected 1: blocks.0.attn1.extra.weight": extra,
            "misshapen 1: blocks.0.attn1.to_q.weight (3, 3)": misshapen}


@pytest.mark.parametrize("problem", ["missing", "unexpected", "misshapen"])
def test_a_tensor_that_does_not_fit_is_named_and_nothing_is_written(problem, native_state, stock_base, tmp_path):
    message, state = next((m, s) for m, s in _mutations(to_original_wan(native_state)).items() if m.startswith(problem))
    path = tmp_path / "bad.pt"
    torch.save({"generator_ema": state}, path)
    out = tmp_path / "out" / "model"
    with pytest.raises(CheckpointError, match=re.escape(message)):
        import_checkpoint(request(path, stock_base, out))
    assert not out.exists()
    assert not (tmp_path / "out").exists() or list((tmp_path / "out").iterdir()) == []


class NotATensor:
    pass


def test_an_unsafe_pickle_is_refused(stock_base, tmp_path):
    path = tmp_path / "unsafe.pt"
    torch.save({"generator_ema": {"w": NotATensor()}}, path)
    with pytest.raises(CheckpointError, match="weights_only=True"):
        import_checkpoint(request(path, stock_base, tmp_path / "out"))
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "extra, named",
    [
        ({"blocks.0.action_model.keyboard_embed.0.weight": torch.zeros(2)}, "Matrix-Game's keyboard and mouse modules"),
        ({"cam_plucker_proj.weight": torch.zeros(2)}, "LingBot-World's camera modules"),
        ({"blocks.0.self_attn.q.lora_A.weight": torch.zeros(2)}, "LoRA weights"),
    ],
)
def test_families_with_their_own_modules_are_refused_by_name(extra, named, native_state, stock_base, tmp_path):
    path = tmp_path / "family.pt"
    torch.save(to_original_wan(native_state) | extra, path)
    with pytest.raises(CheckpointError, match=re.escape(named)):
        import_checkpoint(request(path, stock_base, tmp_path / "out"))


def test_two_experts_are_refused(native_state, stock_base, tmp_path):
    path = tmp_path / "a14b.pt"
    state = to_original_wan(native_state)
    torch.save({"high_noise_model": state, "low_noise_model": state}, path)
    with pytest.raises(CheckpointError, match="two experts"):
        import_checkpoint(request(path, stock_base, tmp_path / "out"))


def test_geometry_flags_are_required_when_the_base_lacks_them(native_state, stock_base, tmp_path):
    path = tmp_path / "w.safetensors"
    save_file(native_state, path)
    with pytest.raises(CheckpointError, match="--sink-size, --window-frames"):
        import_checkpoint(ImportRequest(weights=path, base=stock_base, output=tmp_path / "o", frames_per_block=3))


def test_the_command_line(native_state, stock_base, tmp_path, capsys):
    from clients.cli import main

    path = tmp_path / "w.pt"
    torch.save({"generator_ema": to_original_wan(native_state)}, path)
    out = tmp_path / "cli"
    args = ["import-checkpoint", "--weights", str(path), "--base", str(stock_base), "--output", str(out),
            "--frames-per-block", "3", "--sink-size", "3", "--window-frames", "12", "--dtype", "float32"]
    assert main(args) == 0
    assert "original Wan naming, converted" in capsys.readouterr().out
    assert main(args) == 2  # the folder exists now
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "already exists" in err


# -- --model as a hub id ------------------------------------------------------------


def _cache_with(tmp_path, repo_id, folder):
    """A Hugging Face hub cache holding `folder` as `repo_id`'s main revision, laid out as the hub writes it."""
    cache = tmp_path / "hub"
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    revision = "0123456789abcdef0123456789abcdef01234567"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(revision)
    shutil.copytree(folder, repo / "snapshots" / revision)
    return cache, repo / "snapshots" / revision


def test_a_hub_id_resolves_through_the_cache_offline(world_model_dir, tmp_path, monkeypatch):
    import huggingface_hub.constants

    from clients.cli.rollout import prepare_rollout
    from deployments.models.locate import locate_model

    cache, snapshot = _cache_with(tmp_path, "tiny-org/causal-tiny", world_model_dir)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)  # no folder called tiny-org/ here
    assert locate_model("tiny-org/causal-tiny") == snapshot
    plan = prepare_rollout("tiny-org/causal-tiny", "a fox", tmp_path / "out")
    assert plan.model == snapshot
    with pytest.raises(CheckpointError, match=r"'tiny-org/not-cached'.*HF_HUB_OFFLINE"):
        locate_model("tiny-org/not-cached")
    with pytest.raises(CheckpointError, match="model folder /no/such/folder does not exist"):
        locate_model("/no/such/folder")
