"""The tiny Qwen2.5-Omni thinker checkpoint builds, reloads offline and runs video + audio + text."""

from __future__ import annotations

import os

# No hub here: any attempt to download must fail loudly, not hang.
os.environ["HF_HUB_OFFLINE"] = "1"

import pathlib
import threading

import numpy as np
import pytest
import torch
from transformers import (
    AutoProcessor,
    Qwen2_5OmniProcessor,
    Qwen2_5OmniThinkerForConditionalGeneration,
    TextIteratorStreamer,
)

from deployments.models.tiny_vlm import make_tiny_vlm

SAMPLE_RATE = 16_000


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    return make_tiny_vlm(tmp_path_factory.mktemp("tiny_vlm"), seed=0)


@pytest.fixture(scope="module")
def model(tiny_dir: pathlib.Path) -> Qwen2_5OmniThinkerForConditionalGeneration:
    return Qwen2_5OmniThinkerForConditionalGeneration.from_pretrained(tiny_dir).eval()


@pytest.fixture(scope="module")
def processor(tiny_dir: pathlib.Path) -> Qwen2_5OmniProcessor:
    return AutoProcessor.from_pretrained(tiny_dir)


def _video(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=(4, 64, 64, 3), dtype=np.uint8)


def _audio(seconds: float, seed: int = 0) -> np.ndarray:
    n = int(SAMPLE_RATE * seconds)
    return (0.1 * np.random.default_rng(seed).standard_normal(n)).astype(np.float32)


def _prompt(processor: Qwen2_5OmniProcessor) -> str:
    messages = [
        {
            "role": "user",
            "content": [
                {"type": "video"},
                {"type": "audio"},
                {"type": "text", "text": "What is happening?"},
            ],
        }
    ]
    return processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)


def _inputs(processor: Qwen2_5OmniProcessor, audio: np.ndarray, video: np.ndarray | None = None):
    return processor(
        text=[_prompt(processor)],
        videos=[_video() if video is None else video],
        audio=[audio],
        # The processor's class default would upscale frames; use the saved size.
        videos_kwargs={"size": processor.video_processor.to_dict()["size"], "fps": 4.0},
        padding=True,
        return_tensors="pt",
    )


@pytest.mark.timeout(120)
def test_folder_is_small_and_deterministic(tmp_path: pathlib.Path) -> None:
    first = make_tiny_vlm(tmp_path / "a", seed=0)
    second = make_tiny_vlm(tmp_path / "b", seed=0)
    other = make_tiny_vlm(tmp_path / "c", seed=1)

    names = {p.name for p in first.iterdir()}
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json"} <= names
    assert "README.md" in names
    total = sum(p.stat().st_size for p in first.rglob("*") if p.is_file())
    assert total < 3 * 1024 * 1024, total

    weights = (first / "model.safetensors").read_bytes()
    assert weights == (second / "model.safetensors").read_bytes()
    assert weights != (other / "model.safetensors").read_bytes()


@pytest.mark.timeout(120)
def test_building_leaves_global_rng_alone(tmp_path: pathlib.Path) -> None:
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    make_tiny_vlm(tmp_path, seed=0)
    assert torch.equal(torch.rand(3), expected)


@pytest.mark.timeout(120)
def test_loads_back_offline_with_matching_token_ids(
    model: Qwen2_5OmniThinkerForConditionalGeneration, processor: Qwen2_5OmniProcessor
) -> None:
    assert isinstance(processor, Qwen2_5OmniProcessor)
    tok = processor.tokenizer
    cfg = model.config
    ids = tok.convert_tokens_to_ids
    assert cfg.image_token_id == tok.image_token_id == ids("<|IMAGE|>")
    assert cfg.video_token_id == tok.video_token_id == ids("<|VIDEO|>")
    assert cfg.audio_token_id == tok.audio_token_id == ids("<|AUDIO|>")
    assert cfg.audio_start_token_id == ids("<|audio_bos|>")
    assert cfg.audio_end_token_id == ids("<|audio_eos|>")
    assert cfg.vision_start_token_id == ids("<|vision_bos|>")
    assert cfg.vision_end_token_id == ids("<|vision_eos|>")
    assert cfg.text_config.eos_token_id == tok.eos_token_id == ids("<|im_end|>")
    assert cfg.text_config.pad_token_id == tok.pad_token_id == ids("<|endoftext|>")
    assert cfg.text_config.bos_token_id == ids("<|im_start|>")
    assert ids("<|im_end|>") in model.generation_config.eos_token_id
    # Every id the model can emit is a real token.
    assert cfg.text_config.vocab_size == len(tok)
    assert processor.feature_extractor.feature_size == cfg.audio_config.num_mel_bins == 16
    # A plain load gives small saved sizes (no 100k-pixel default).
    assert processor.video_processor.size.longest_edge <= 64 * 28 * 28
    assert processor.image_processor.size.longest_edge <= 64 * 28 * 28


@pytest.mark.timeout(120)
def test_chat_template_has_placeholders(processor: Qwen2_5OmniProcessor) -> None:
    prompt = _prompt(processor)
    assert prompt.startswith("<|im_start|>system\n")
    assert "<|vision_bos|><|VIDEO|><|vision_eos|>" in prompt
    assert "<|audio_bos|><|AUDIO|><|audio_eos|>" in prompt
    assert prompt.endswith("<|im_start|>assistant\n")


@pytest.mark.timeout(120)
def test_video_audio_text_generate_and_stream(
    model: Qwen2_5OmniThinkerForConditionalGeneration, processor: Qwen2_5OmniProcessor
) -> None:
    inputs = _inputs(processor, _audio(1.5))

    assert inputs["input_features"].shape == (1, 16, 3000)
    assert inputs["feature_attention_mask"].shape == (1, 3000)
    assert int(inputs["feature_attention_mask"].sum()) == 150  # 1.5 s at a 10 ms hop
    # 4 frames -> 2 temporal patches; 64x64 resized to 56x56 -> 4x4 patches of 14.
    assert inputs["video_grid_thw"].tolist() == [[2, 4, 4]]
    assert inputs["pixel_values_videos"].shape == (2 * 4 * 4, 3 * 2 * 14 * 14)
    n_video = int((inputs["input_ids"] == model.config.video_token_id).sum())
    assert n_video == 2 * 4 * 4 // 4

    new_tokens = 8
    with torch.inference_mode():
        out = model.generate(**inputs, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)
    assert out.shape == (1, inputs["input_ids"].shape[1] + new_tokens)

    streamer = TextIteratorStreamer(processor.tokenizer, skip_prompt=True, skip_special_tokens=True, timeout=60)
    kwargs = dict(**inputs, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, streamer=streamer)
    thread = threading.Thread(target=model.generate, kwargs=kwargs)
    thread.start()
    pieces = list(streamer)
    thread.join(timeout=60)
    assert not thread.is_alive()
    assert pieces
    streamed = "".join(pieces)
    assert streamed
    # The streamed text is the decoded greedy continuation.
    assert streamed == processor.tokenizer.decode(
        out[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True
    )


@pytest.mark.timeout(120)
def test_audio_changes_the_model_input(
    model: Qwen2_5OmniThinkerForConditionalGeneration, processor: Qwen2_5OmniProcessor
) -> None:
    audio_id = model.config.audio_token_id
    short = _inputs(processor, _audio(1.0))
    long = _inputs(processor, _audio(2.0))
    n_short = int((short["input_ids"] == audio_id).sum())
    n_long = int((long["input_ids"] == audio_id).sum())
    assert n_short == 25  # 100 mel frames -> /2 conv -> /2 pool
    assert n_long == 50

    # Same length, different sound: the audio encoder reaches the logits.
    other = _inputs(processor, _audio(1.0, seed=1))
    assert torch.equal(short["input_ids"], other["input_ids"])
    with torch.inference_mode():
        logits_a = model(**short).logits[0, -1]
        logits_b = model(**other).logits[0, -1]
    assert not torch.allclose(logits_a, logits_b)
