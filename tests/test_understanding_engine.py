"""The understanding engine: frames + audio + text in, streamed greedy text out (no Ray, no WebSocket)."""

from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"

import json
import pathlib
import shutil
import threading
import time

import numpy as np
import pytest
import torch

from deployments.models.tiny_vlm import make_tiny_vlm
from deployments.understanding.engine import (
    UnderstandingEngine,
    UnsupportedCheckpointError,
)

SAMPLE_RATE = 16_000


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    return make_tiny_vlm(tmp_path_factory.mktemp("understanding") / "tiny-omni", seed=0)


@pytest.fixture(scope="module")
def engine(tiny_dir: pathlib.Path) -> UnderstandingEngine:
    # Random weights may pick an end token at once: force a few tokens.
    return UnderstandingEngine.from_pretrained(tiny_dir, min_new_tokens=8)


def _frames(n: int, seed: int = 0, size: tuple[int, int] = (48, 64)) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, size=(*size, 3), dtype=np.uint8) for _ in range(n)]


def _audio(seconds: float, seed: int = 0) -> np.ndarray:
    n = int(SAMPLE_RATE * seconds)
    return (0.1 * np.random.default_rng(seed).standard_normal(n)).astype(np.float32)


def _last_logits(engine: UnderstandingEngine, inputs) -> torch.Tensor:
    with torch.inference_mode():
        return engine.model(**inputs).logits[0, -1].float()


def _drain(stream) -> list[str]:
    return list(stream)


@pytest.mark.timeout(120)
def test_loads_the_tiny_omni_thinker(engine: UnderstandingEngine, tiny_dir: pathlib.Path) -> None:
    assert type(engine.model).__name__ == "Qwen2_5OmniThinkerForConditionalGeneration"
    assert engine.takes_audio is True
    assert engine.model_name == tiny_dir.name
    assert engine.model_type == "qwen2_5_omni_thinker"
    assert engine.max_frames == 64
    assert engine.max_audio_samples == 30 * SAMPLE_RATE
    named = UnderstandingEngine.from_pretrained(tiny_dir, model_name="served-name")
    assert named.model_name == "served-name"


@pytest.mark.timeout(120)
def test_stream_joins_to_the_greedy_answer(engine: UnderstandingEngine) -> None:
    frames, audio = _frames(4), _audio(1.0)
    deltas = _drain(engine.stream_answer(frames, audio, "What is happening?", max_new_tokens=24, min_new_tokens=24))
    assert len(deltas) >= 3, deltas
    assert all(isinstance(d, str) and d for d in deltas)
    whole = engine.answer(frames, audio, "What is happening?", max_new_tokens=24, min_new_tokens=24)
    assert "".join(deltas) == whole
    # Greedy: the same query streams the same text again.
    again = _drain(engine.stream_answer(frames, audio, "What is happening?", max_new_tokens=24, min_new_tokens=24))
    assert "".join(again) == whole


@pytest.mark.timeout(120)
def test_the_prompt_is_video_then_audio_then_text(engine: UnderstandingEngine) -> None:
    inputs = engine.build_inputs(_frames(4), _audio(1.0), "Say hi", None, fps=2.0)
    prompt = engine.tokenizer.decode(inputs["input_ids"][0])
    video, audio, text = prompt.index("<|VIDEO|>"), prompt.index("<|AUDIO|>"), prompt.index("Say hi")
    assert video < audio < text
    assert prompt.endswith("<|im_start|>assistant\n")
    # 4 frames of 48x64 -> 56x56 (saved size kept, no class-default upscale): 2 x 4 x 4 patches.
    assert inputs["video_grid_thw"].tolist() == [[2, 4, 4]]
    assert int((inputs["input_ids"] == engine.model.config.video_token_id).sum()) == 2 * 4 * 4 // 4


@pytest.mark.timeout(120)
def test_audio_reaches_the_model(engine: UnderstandingEngine) -> None:
    frames = _frames(4)
    audio_id = engine.model.config.audio_token_id
    with_audio = engine.build_inputs(frames, _audio(1.0), "Listen.", None, 2.0)
    without = engine.build_inputs(frames, None, "Listen.", None, 2.0)
    empty = engine.build_inputs(frames, np.zeros(0, np.float32), "Listen.", None, 2.0)

    assert "input_features" in with_audio and "feature_attention_mask" in with_audio
    assert int(with_audio["feature_attention_mask"].sum()) == 100  # 1 s at a 10 ms hop
    assert int((with_audio["input_ids"] == audio_id).sum()) == 25
    for inputs in (without, empty):
        assert "input_features" not in inputs
        assert int((inputs["input_ids"] == audio_id).sum()) == 0

    # Same length, different sound: same tokens, different features, different logits.
    other = engine.build_inputs(frames, _audio(1.0, seed=1), "Listen.", None, 2.0)
    assert torch.equal(with_audio["input_ids"], other["input_ids"])
    assert not torch.equal(with_audio["input_features"], other["input_features"])
    assert not torch.allclose(_last_logits(engine, with_audio), _last_logits(engine, other))

    # And the audio tower actually runs during a streamed answer.
    calls: list[tuple[int, ...]] = []
    hook = engine.model.model.audio_tower.register_forward_hook(lambda m, a, o: calls.append(tuple(a[0].shape)))
    try:
        assert _drain(engine.stream_answer(frames, _audio(1.0), "Listen.", max_new_tokens=4))
        assert calls, "audio tower never ran"
        calls.clear()
        _drain(engine.stream_answer(frames, None, "Listen.", max_new_tokens=4))
        assert not calls
    finally:
        hook.remove()


@pytest.mark.timeout(120)
def test_frame_count_and_order_matter(engine: UnderstandingEngine) -> None:
    frames = _frames(4)
    forward = engine.build_inputs(frames, None, "Which way?", None, 2.0)
    backward = engine.build_inputs(frames[::-1], None, "Which way?", None, 2.0)
    assert torch.equal(forward["input_ids"], backward["input_ids"])
    assert not torch.equal(forward["pixel_values_videos"], backward["pixel_values_videos"])
    assert not torch.allclose(_last_logits(engine, forward), _last_logits(engine, backward))

    video_id = engine.model.config.video_token_id
    counts = {}
    for n in (2, 3, 4, 8):
        inputs = engine.build_inputs(_frames(n), None, "Count.", None, 2.0)
        counts[n] = int((inputs["input_ids"] == video_id).sum())
        # Odd counts are padded by the processor to whole temporal patches of 2.
        assert inputs["video_grid_thw"][0, 0].item() == (n + 1) // 2
    assert counts[2] < counts[4] < counts[8]
    assert counts[3] == counts[4]


@pytest.mark.timeout(120)
def test_fps_sets_the_time_step(engine: UnderstandingEngine) -> None:
    slow = engine.build_inputs(_frames(4), None, "When?", None, fps=1.0)
    fast = engine.build_inputs(_frames(4), None, "When?", None, fps=4.0)
    assert slow["video_second_per_grid"].tolist() == [2.0]
    assert fast["video_second_per_grid"].tolist() == [0.5]


@pytest.mark.timeout(120)
def test_a_single_frame_goes_in_as_an_image(engine: UnderstandingEngine) -> None:
    inputs = engine.build_inputs(_frames(1), _audio(0.5), "What is this?", None, 2.0)
    assert "pixel_values" in inputs and "pixel_values_videos" not in inputs
    assert int((inputs["input_ids"] == engine.model.config.image_token_id).sum()) > 0
    deltas = _drain(engine.stream_answer(_frames(1), _audio(0.5), "What is this?", max_new_tokens=8))
    assert "".join(deltas)


@pytest.mark.timeout(120)
def test_frames_of_different_sizes_are_resized_to_the_first(engine: UnderstandingEngine) -> None:
    frames = _frames(2, size=(48, 64)) + _frames(2, seed=3, size=(120, 90))
    inputs = engine.build_inputs(frames, None, "Mixed.", None, 2.0)
    same = engine.build_inputs(_frames(4), None, "Mixed.", None, 2.0)
    assert inputs["video_grid_thw"].tolist() == same["video_grid_thw"].tolist()
    assert "".join(_drain(engine.stream_answer(frames, None, "Mixed.", max_new_tokens=4)))


@pytest.mark.timeout(120)
def test_system_prompt_changes_the_prompt(engine: UnderstandingEngine) -> None:
    frames = _frames(2)
    default = engine.build_inputs(frames, None, "Hi", None, 2.0)
    custom = engine.build_inputs(frames, None, "Hi", "Answer like a pirate.", 2.0)
    a, b = default["input_ids"], custom["input_ids"]
    assert a.shape != b.shape or not torch.equal(a, b)
    text = engine.tokenizer.decode(custom["input_ids"][0])
    assert text.startswith("<|im_start|>system\nAnswer like a pirate.<|im_end|>\n<|im_start|>user\n")
    assert "You are Qwen" not in text
    assert "You are Qwen" in engine.tokenizer.decode(default["input_ids"][0])


@pytest.mark.timeout(120)
def test_stop_ends_the_stream_early_and_joins_the_thread(engine: UnderstandingEngine) -> None:
    baseline = threading.active_count()
    steps = []
    hook = engine.model.register_forward_hook(lambda m, a, o: steps.append(1))
    stop = threading.Event()
    try:
        deltas = []
        for delta in engine.stream_answer(
            _frames(4), None, "Talk forever.", max_new_tokens=400, min_new_tokens=400, stop=stop
        ):
            deltas.append(delta)
            stop.set()
    finally:
        hook.remove()
    assert deltas
    assert len(steps) < 100, len(steps)
    assert threading.active_count() == baseline

    # Already stopped before it starts: no generate at all, no thread left.
    steps.clear()
    hook = engine.model.register_forward_hook(lambda m, a, o: steps.append(1))
    try:
        deltas = _drain(engine.stream_answer(_frames(2), None, "x", max_new_tokens=400, min_new_tokens=400, stop=stop))
    finally:
        hook.remove()
    assert deltas == [] and steps == []
    assert threading.active_count() == baseline


@pytest.mark.timeout(120)
def test_the_stream_can_be_driven_from_worker_threads(engine: UnderstandingEngine) -> None:
    """As a Serve replica does: each next() and the close() in some pool thread."""
    from concurrent.futures import ThreadPoolExecutor

    baseline = threading.active_count()
    expected = engine.answer(_frames(3), None, "Pool.", max_new_tokens=12, min_new_tokens=12)
    with ThreadPoolExecutor(max_workers=4) as pool:
        stream = engine.stream_answer(_frames(3), None, "Pool.", max_new_tokens=12, min_new_tokens=12)
        pieces = []
        while (piece := pool.submit(next, stream, None).result(timeout=60)) is not None:
            pieces.append(piece)
        assert "".join(pieces) == expected

        stop = threading.Event()
        stream = engine.stream_answer(_frames(3), None, "Pool.", max_new_tokens=2000, min_new_tokens=2000, stop=stop)
        assert pool.submit(next, stream, None).result(timeout=60)
        stop.set()
        pool.submit(stream.close).result(timeout=30)
    assert threading.active_count() == baseline
    assert engine.answer(_frames(2), None, "Free.", max_new_tokens=4)


@pytest.mark.timeout(120)
def test_closing_the_stream_stops_generation_and_frees_the_engine(engine: UnderstandingEngine) -> None:
    baseline = threading.active_count()
    stream = engine.stream_answer(_frames(4), None, "Long.", max_new_tokens=2000, min_new_tokens=2000)
    assert next(stream)
    started = time.monotonic()
    stream.close()
    assert time.monotonic() - started < 5
    assert threading.active_count() == baseline
    # The lock was released: the next query runs.
    assert engine.answer(_frames(2), None, "Again.", max_new_tokens=4)


@pytest.mark.timeout(120)
def test_an_exception_in_generate_surfaces(engine: UnderstandingEngine, monkeypatch: pytest.MonkeyPatch) -> None:
    baseline = threading.active_count()

    def boom(**kwargs):
        raise RuntimeError("generate exploded")

    monkeypatch.setattr(engine.model, "generate", boom)
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="generate exploded"):
        _drain(engine.stream_answer(_frames(2), None, "Fail.", max_new_tokens=8))
    assert time.monotonic() - started < 10
    assert threading.active_count() == baseline
    monkeypatch.undo()
    # The engine still works afterwards (the lock was released).
    assert "".join(_drain(engine.stream_answer(_frames(2), None, "Fine.", max_new_tokens=4)))


@pytest.mark.timeout(120)
def test_an_exception_mid_stream_surfaces_after_the_deltas(engine: UnderstandingEngine) -> None:
    baseline = threading.active_count()
    steps = []

    def failing(module, args, output):
        steps.append(1)
        if len(steps) == 6:
            raise ValueError("forward failed at step 6")

    hook = engine.model.register_forward_hook(failing)
    deltas = []
    try:
        with pytest.raises(ValueError, match="step 6"):
            for delta in engine.stream_answer(_frames(2), None, "Go.", max_new_tokens=32, min_new_tokens=32):
                deltas.append(delta)
    finally:
        hook.remove()
    assert deltas  # tokens before the failure were streamed
    assert threading.active_count() == baseline


@pytest.mark.timeout(120)
def test_one_generate_at_a_time(engine: UnderstandingEngine, monkeypatch: pytest.MonkeyPatch) -> None:
    original = engine.model.generate
    active, peak = [0], [0]
    guard = threading.Lock()

    def counting(**kwargs):
        with guard:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        try:
            time.sleep(0.05)
            return original(**kwargs)
        finally:
            with guard:
                active[0] -= 1

    monkeypatch.setattr(engine.model, "generate", counting)
    results: list[str] = []
    errors: list[BaseException] = []

    def worker(seed: int) -> None:
        try:
            results.append("".join(engine.stream_answer(_frames(2, seed=seed), None, "Q", max_new_tokens=6)))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert len(results) == 3 and all(results)
    assert peak[0] == 1


@pytest.mark.timeout(120)
def test_limits_are_enforced_with_clear_errors(engine: UnderstandingEngine, tiny_dir: pathlib.Path) -> None:
    with pytest.raises(ValueError, match=r"too many frames: 65 \(limit 64\)"):
        engine.build_inputs(_frames(65, size=(8, 8)), None, "x", None, 2.0)
    assert engine.build_inputs(_frames(64, size=(8, 8)), None, "x", None, 2.0)["video_grid_thw"][0, 0] == 32
    with pytest.raises(ValueError, match=r"audio too long: 30\.50 s \(limit 30 s"):
        engine.build_inputs(_frames(2), _audio(30.5), "x", None, 2.0)
    full = engine.build_inputs(_frames(2), _audio(30.0), "x", None, 2.0)
    assert int(full["feature_attention_mask"].sum()) == 3000
    with pytest.raises(ValueError, match="at least one frame"):
        engine.build_inputs([], None, "x", None, 2.0)
    with pytest.raises(ValueError, match=r"frame 1 must be a uint8 array of shape \(H, W, 3\)"):
        engine.build_inputs([_frames(1)[0], np.zeros((8, 8), np.uint8)], None, "x", None, 2.0)
    with pytest.raises(ValueError, match="non-empty"):
        engine.build_inputs(_frames(2), None, "  ", None, 2.0)
    with pytest.raises(ValueError, match="fps"):
        engine.build_inputs(_frames(2), None, "x", None, 0.0)
    with pytest.raises(ValueError, match="mono"):
        engine.build_inputs(_frames(2), np.zeros((2, 100), np.float32), "x", None, 2.0)
    with pytest.raises(ValueError, match="max_new_tokens"):
        _drain(engine.stream_answer(_frames(2), None, "x", max_new_tokens=0))
    small = UnderstandingEngine.from_pretrained(tiny_dir, max_frames=4, max_audio_seconds=2.0)
    with pytest.raises(ValueError, match=r"limit 4\)"):
        small.build_inputs(_frames(5), None, "x", None, 2.0)
    with pytest.raises(ValueError, match="limit 2 s"):
        small.build_inputs(_frames(2), _audio(2.5), "x", None, 2.0)


@pytest.mark.timeout(120)
def test_refuses_a_checkpoint_that_is_not_a_vlm(tmp_path: pathlib.Path) -> None:
    llama = tmp_path / "llama"
    llama.mkdir()
    (llama / "config.json").write_text(json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"]}))
    with pytest.raises(UnsupportedCheckpointError, match=r"model_type 'llama'.*LlamaForCausalLM.*qwen2_5_omni_thinker"):
        UnderstandingEngine.from_pretrained(llama)

    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "model_index.json").write_text("{}")  # a diffusers pipeline, say
    with pytest.raises(UnsupportedCheckpointError, match="no config.json"):
        UnderstandingEngine.from_pretrained(bare)

    with pytest.raises(UnsupportedCheckpointError, match="Not a checkpoint folder"):
        UnderstandingEngine.from_pretrained(tmp_path / "missing")
    assert issubclass(UnsupportedCheckpointError, ValueError)


@pytest.mark.timeout(120)
def test_loads_only_the_thinker_from_a_full_omni_folder(
    engine: UnderstandingEngine, tiny_dir: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    from safetensors.torch import load_file, save_file
    from transformers import Qwen2_5OmniConfig, Qwen2_5OmniThinkerConfig

    full_dir = tmp_path / "full-omni"
    shutil.copytree(tiny_dir, full_dir)
    thinker = Qwen2_5OmniThinkerConfig.from_pretrained(tiny_dir)
    config = Qwen2_5OmniConfig(thinker_config=thinker.to_dict(), enable_audio_output=False)
    config.architectures = ["Qwen2_5OmniForConditionalGeneration"]
    config.save_pretrained(full_dir)
    weights = {f"thinker.{k}": v for k, v in load_file(tiny_dir / "model.safetensors").items()}
    weights["talker.codec_head.weight"] = torch.zeros(2, 2)  # skipped, never loaded
    save_file(weights, full_dir / "model.safetensors", metadata={"format": "pt"})

    full = UnderstandingEngine.from_pretrained(full_dir, min_new_tokens=8)
    assert full.model_type == "qwen2_5_omni" and full.takes_audio
    assert type(full.model).__name__ == "Qwen2_5OmniThinkerForConditionalGeneration"
    ours, theirs = engine.model.state_dict(), full.model.state_dict()
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)
    query = (_frames(2), _audio(0.5), "Same?")
    assert full.answer(*query, max_new_tokens=6) == engine.answer(*query, max_new_tokens=6)


# --------------------------------------------------------------------------
# A tiny Qwen2.5-VL (no audio): the engine picks its class from config.json.

_VL_SPECIALS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
)
_VL_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}"
    "{% endfor %}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _make_tiny_qwen2_5_vl(out: pathlib.Path) -> pathlib.Path:
    from transformers import (
        GenerationConfig,
        Qwen2_5_VLConfig,
        Qwen2_5_VLForConditionalGeneration,
        Qwen2_5_VLProcessor,
        Qwen2Tokenizer,
        Qwen2VLImageProcessor,
        Qwen2VLVideoProcessor,
    )
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    vocab = {s: i for i, s in enumerate(bytes_to_unicode().values())}
    for token in _VL_SPECIALS:
        vocab[token] = len(vocab)
    tok = Qwen2Tokenizer(
        vocab=vocab,
        merges=[],
        unk_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        extra_special_tokens=list(_VL_SPECIALS),
    )
    vision = dict(min_pixels=4 * 28 * 28, max_pixels=64 * 28 * 28, patch_size=14, temporal_patch_size=2, merge_size=2)
    processor = Qwen2_5_VLProcessor(
        image_processor=Qwen2VLImageProcessor(**vision),
        video_processor=Qwen2VLVideoProcessor(**vision, cap_pixels_per_frame=True),
        tokenizer=tok,
        chat_template=_VL_TEMPLATE,
    )
    ids = tok.convert_tokens_to_ids
    config = Qwen2_5_VLConfig(
        text_config=dict(
            vocab_size=len(tok),
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [2, 3, 3]},
            bos_token_id=ids("<|im_start|>"),
            eos_token_id=ids("<|im_end|>"),
            pad_token_id=ids("<|endoftext|>"),
            tie_word_embeddings=False,
        ),
        vision_config=dict(
            depth=2,
            hidden_size=32,
            intermediate_size=64,
            num_heads=2,
            patch_size=14,
            spatial_merge_size=2,
            temporal_patch_size=2,
            window_size=112,
            out_hidden_size=64,
            fullatt_block_indexes=[1],
        ),
        image_token_id=ids("<|image_pad|>"),
        video_token_id=ids("<|video_pad|>"),
        vision_start_token_id=ids("<|vision_start|>"),
        vision_end_token_id=ids("<|vision_end|>"),
        tie_word_embeddings=False,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = Qwen2_5_VLForConditionalGeneration(config).eval()
    model.generation_config = GenerationConfig(
        eos_token_id=[ids("<|im_end|>"), ids("<|endoftext|>")], pad_token_id=ids("<|endoftext|>")
    )
    model.save_pretrained(out)
    processor.save_pretrained(out)
    return out


@pytest.mark.timeout(120)
def test_a_qwen2_5_vl_checkpoint_takes_video_but_no_audio(tmp_path: pathlib.Path) -> None:
    vl = UnderstandingEngine.from_pretrained(_make_tiny_qwen2_5_vl(tmp_path / "tiny-vl"), min_new_tokens=6)
    assert type(vl.model).__name__ == "Qwen2_5_VLForConditionalGeneration"
    assert vl.model_type == "qwen2_5_vl" and vl.takes_audio is False

    inputs = vl.build_inputs(_frames(4), _audio(1.0), "What?", None, fps=4.0)
    assert "input_features" not in inputs  # audio is dropped for a model without ears
    assert inputs["video_grid_thw"].tolist() == [[2, 4, 4]]
    assert inputs["second_per_grid_ts"].tolist() == [0.5]  # fps reaches the VL processor too
    reversed_inputs = vl.build_inputs(_frames(4)[::-1], None, "What?", None, fps=4.0)
    assert not torch.equal(inputs["pixel_values_videos"], reversed_inputs["pixel_values_videos"])

    deltas = _drain(vl.stream_answer(_frames(4), _audio(1.0), "What?", max_new_tokens=12, min_new_tokens=12))
    assert deltas and "".join(deltas) == vl.answer(_frames(4), None, "What?", max_new_tokens=12, min_new_tokens=12)
    assert "".join(_drain(vl.stream_answer(_frames(1), None, "One.", max_new_tokens=4)))


@pytest.mark.timeout(120)
def test_stop_while_waiting_for_the_engine_gives_up(engine: UnderstandingEngine) -> None:
    stop = threading.Event()
    got: list[list[str]] = []
    engine._lock.acquire()  # another query holds the engine
    try:
        waiter = threading.Thread(target=lambda: got.append(list(engine.stream_answer(_frames(2), None, "w", stop=stop))))
        waiter.start()
        time.sleep(0.3)
        assert waiter.is_alive()  # still waiting for the engine
        stop.set()
        waiter.join(5)
        assert not waiter.is_alive()
    finally:
        engine._lock.release()
    assert got == [[]]
