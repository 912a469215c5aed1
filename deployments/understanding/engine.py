"""The video-understanding engine: frames + audio + text in, streamed text out.

No Ray and no WebSocket here; a Serve replica wraps it (the wire contract is
PROTOCOL.md section 2). One query's prompt is, in order: the sampled frames,
the buffered audio (only when the model takes audio), then the user's text,
optionally preceded by a system message. The answer streams back as text
deltas while `generate` runs in a worker thread.

Supported checkpoints, decided from `config.json` (`model_type`, then
`architectures`), never by trying classes until one loads:
- `qwen2_5_omni_thinker`: a Qwen2.5-Omni thinker (video + audio + text).
- `qwen2_5_omni`: a full Qwen2.5-Omni folder; only its thinker is loaded (the
  talker and token2wav weights are skipped: we answer in text).
- `qwen2_5_vl`, `qwen2_vl`: Qwen2.5-VL / Qwen2-VL (video + text, no audio).
Anything else is refused with `UnsupportedCheckpointError`.

How the frames go in: T >= 2 frames are ONE video of T frames, in order (the
model's temporal patches and time positions see them as a clip); a single
frame goes in as an image (Qwen's image path repeats it over the temporal
patch itself, and a still has no frame rate). An odd T is fine: the Qwen2-VL
video processor repeats the last frame up to a multiple of
`temporal_patch_size`. Frames of different sizes are resized to the first
frame's size (the video processor needs one size per clip).

Traps handled here (transformers 5.24):
- `Qwen2_5OmniProcessor` passes its own class default video `size` (100k to
  600k pixels per frame) on every call, whatever the checkpoint saved, so we
  pass the saved size back explicitly (`videos_kwargs={"size": ...}`); for a
  real checkpoint the saved size is the default, so this changes nothing.
- We pass `do_sample_frames=False`: the frames are already sampled by the
  server; a processor config with sampling on would resample them again.
- The frame rate reaches time positions differently per family: the Omni
  processor reads `videos_kwargs["fps"]`, the Qwen2.5-VL processor reads
  `video_metadata[i].fps`. We pass both.
- `TextIteratorStreamer` only releases text at word boundaries (spaces and
  newlines) and blocks forever if `generate` dies before calling `end()`. We
  use a subclass that releases every decoded token (holding back only a
  trailing incomplete UTF-8 character) and poll it with a short timeout while
  watching the generate thread.

Thread-safety: any number of threads may call `build_inputs` at once (it
only touches the processor). `stream_answer` and `answer` run one `generate`
at a time per engine, behind a lock held from the start of generation until
its thread is joined; a second caller waits. Batching queries is future work.
"""

from __future__ import annotations

import json
import math
import queue
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import (
    AutoProcessor,
    BatchFeature,
    StoppingCriteria,
    StoppingCriteriaList,
    TextIteratorStreamer,
)

__all__ = [
    "DEFAULT_MAX_AUDIO_SECONDS",
    "DEFAULT_MAX_FRAMES",
    "SUPPORTED_MODEL_TYPES",
    "UnderstandingEngine",
    "UnsupportedCheckpointError",
]

# One query sees at most this many frames: the protocol's ring buffer holds
# 64 by default, and every frame costs vision-encoder time and KV memory.
DEFAULT_MAX_FRAMES = 64
# Whisper-style feature extractors pad/truncate to a 30 s window; audio
# beyond it would be silently cut, so it is refused instead.
DEFAULT_MAX_AUDIO_SECONDS = 30.0
# How often the streaming loop wakes to check the generate thread and the
# stop event while no token arrives.
_POLL_S = 0.05

# model_type -> (model class name in transformers, takes audio)
SUPPORTED_MODEL_TYPES: dict[str, tuple[str, bool]] = {
    "qwen2_5_omni_thinker": ("Qwen2_5OmniThinkerForConditionalGeneration", True),
    "qwen2_5_omni": ("Qwen2_5OmniThinkerForConditionalGeneration", True),
    "qwen2_5_vl": ("Qwen2_5_VLForConditionalGeneration", False),
    "qwen2_vl": ("Qwen2VLForConditionalGeneration", False),
}
_ARCHITECTURE_TO_TYPE = {
    "Qwen2_5OmniThinkerForConditionalGeneration": "qwen2_5_omni_thinker",
    "Qwen2_5OmniForConditionalGeneration": "qwen2_5_omni",
    "Qwen2_5OmniModel": "qwen2_5_omni",
    "Qwen2_5_VLForConditionalGeneration": "qwen2_5_vl",
    "Qwen2VLForConditionalGeneration": "qwen2_vl",
}


class UnsupportedCheckpointError(ValueError):
    """The folder is not a checkpoint this engine can serve."""


def _resolve_model_type(path: Path) -> str:
    config_file = path / "config.json"
    if not config_file.is_file():
        raise UnsupportedCheckpointError(
            f"Not a vision-language checkpoint: {path} has no config.json "
            f"(supported model types: {', '.join(SUPPORTED_MODEL_TYPES)})"
        )
    try:
        config = json.loads(config_file.read_text())
    except (OSError, ValueError) as exc:
        raise UnsupportedCheckpointError(f"Unreadable config.json in {path}: {exc}") from exc
    model_type = config.get("model_type") if isinstance(config, dict) else None
    architectures = config.get("architectures") or [] if isinstance(config, dict) else []
    if model_type in SUPPORTED_MODEL_TYPES:
        return model_type
    for arch in architectures:
        if arch in _ARCHITECTURE_TO_TYPE:
            return _ARCHITECTURE_TO_TYPE[arch]
    raise UnsupportedCheckpointError(
        f"Unsupported checkpoint for video understanding: {path} has model_type "
        f"{model_type!r} (architectures {architectures}); supported model types: "
        f"{', '.join(SUPPORTED_MODEL_TYPES)}"
    )


def _load_model(path: Path, model_type: str, dtype: torch.dtype) -> torch.nn.Module:
    import transformers

    class_name, _ = SUPPORTED_MODEL_TYPES[model_type]
    model_cls = getattr(transformers, class_name)
    if model_type == "qwen2_5_omni":
        # A full Omni folder: build the thinker from its nested config and load
        # only the `thinker.*` weights (talker / token2wav stay on disk).
        from transformers import Qwen2_5OmniConfig

        full = Qwen2_5OmniConfig.from_pretrained(path)
        return model_cls.from_pretrained(
            path, config=full.thinker_config, dtype=dtype, key_mapping={r"^thinker\.": ""}
        )
    return model_cls.from_pretrained(path, dtype=dtype)


class _StopEvents(StoppingCriteria):
    """Ends generation as soon as any of the events is set (checked per token)."""

    def __init__(self, *events: threading.Event | None) -> None:
        self.events = [e for e in events if e is not None]

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs: Any) -> torch.BoolTensor:
        stop = any(e.is_set() for e in self.events)
        return torch.full((input_ids.shape[0],), stop, dtype=torch.bool, device=input_ids.device)


class _TokenStreamer(TextIteratorStreamer):
    """A `TextIteratorStreamer` that releases text per token, not per word.

    The stock streamer holds text back until a space or newline, so an answer
    without spaces (or a slow model) would arrive in one lump at the end. We
    release everything decoded so far except a trailing U+FFFD, which may be
    the first bytes of a multi-byte character still being generated.
    """

    def put(self, value: torch.Tensor) -> None:
        if len(value.shape) > 1 and value.shape[0] > 1:
            raise ValueError("_TokenStreamer only supports batch size 1")
        if len(value.shape) > 1:
            value = value[0]
        if self.skip_prompt and self.next_tokens_are_prompt:
            self.next_tokens_are_prompt = False
            return
        self.token_cache.extend(value.tolist())
        text = self.tokenizer.decode(self.token_cache, **self.decode_kwargs)
        if text.endswith("\n"):
            printable, self.token_cache, self.print_len = text[self.print_len :], [], 0
        else:
            end = len(text.rstrip("\ufffd"))
            printable = text[self.print_len : end] if end > self.print_len else ""
            self.print_len += len(printable)
        if printable:
            self.on_finalized_text(printable)


class UnderstandingEngine:
    """One loaded VLM; answers queries over sampled frames (+ audio) and text."""

    def __init__(
        self,
        model: torch.nn.Module,
        processor: Any,
        *,
        model_type: str,
        model_name: str,
        max_frames: int = DEFAULT_MAX_FRAMES,
        max_audio_seconds: float = DEFAULT_MAX_AUDIO_SECONDS,
        min_new_tokens: int | None = None,
    ) -> None:
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise UnsupportedCheckpointError(f"Unsupported model type {model_type!r}")
        if max_frames < 1:
            raise ValueError("max_frames must be >= 1")
        self.model = model.eval()
        self.processor = processor
        self.tokenizer = processor.tokenizer
        self.model_type = model_type
        self.model_name = model_name
        self.takes_audio: bool = SUPPORTED_MODEL_TYPES[model_type][1] and getattr(processor, "feature_extractor", None) is not None
        self.max_frames = int(max_frames)
        self.sampling_rate = int(getattr(getattr(processor, "feature_extractor", None), "sampling_rate", 16_000))
        # Never beyond the feature extractor's own window (30 s for Whisper).
        window = getattr(getattr(processor, "feature_extractor", None), "chunk_length", None)
        limit = float(max_audio_seconds)
        if window:
            limit = min(limit, float(window))
        self.max_audio_seconds = limit
        self.max_audio_samples = round(limit * self.sampling_rate)
        # Only for tiny random checkpoints, whose answers may otherwise end at
        # once: a real model does not need it. Per-call value overrides.
        self.min_new_tokens = min_new_tokens
        self.device = next(model.parameters()).device
        # The model's own dtype: modules kept in float32 may come first among the parameters.
        self.dtype = getattr(model, "dtype", None) or next(model.parameters()).dtype
        # The saved video size; the Omni processor would otherwise impose its
        # class default (see module docstring).
        video_processor = getattr(processor, "video_processor", None)
        self._video_size = dict(video_processor.to_dict()["size"]) if video_processor is not None else None
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ load
    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
        *,
        model_name: str | None = None,
        max_frames: int = DEFAULT_MAX_FRAMES,
        max_audio_seconds: float = DEFAULT_MAX_AUDIO_SECONDS,
        min_new_tokens: int | None = None,
    ) -> UnderstandingEngine:
        """Load a checkpoint folder; the model class follows its config.json.

        Raises `UnsupportedCheckpointError` for a folder that is not a
        supported vision-language checkpoint (before loading any weights).
        """
        path = Path(path)
        if not path.is_dir():
            raise UnsupportedCheckpointError(f"Not a checkpoint folder: {path}")
        model_type = _resolve_model_type(path)
        processor = AutoProcessor.from_pretrained(path)
        if getattr(processor, "tokenizer", None) is None or getattr(processor, "video_processor", None) is None:
            raise UnsupportedCheckpointError(
                f"{path}: the processor ({type(processor).__name__}) has no tokenizer or video processor"
            )
        model = _load_model(path, model_type, dtype).to(device).eval()
        return cls(
            model,
            processor,
            model_type=model_type,
            model_name=model_name or path.name,
            max_frames=max_frames,
            max_audio_seconds=max_audio_seconds,
            min_new_tokens=min_new_tokens,
        )

    # ---------------------------------------------------------------- inputs
    def check_frames(self, frames: list[np.ndarray], size: tuple[int, int] | None = None) -> list[np.ndarray]:
        """Valid uint8 RGB frames, all resized to `size` (height, width), by default the first frame's."""
        if isinstance(frames, np.ndarray) and frames.ndim == 4:
            frames = list(frames)
        if not isinstance(frames, (list, tuple)) or len(frames) == 0:
            raise ValueError("at least one frame is required")
        if len(frames) > self.max_frames:
            raise ValueError(f"too many frames: {len(frames)} (limit {self.max_frames})")
        out = []
        for i, frame in enumerate(frames):
            if not isinstance(frame, np.ndarray) or frame.dtype != np.uint8 or frame.ndim != 3 or frame.shape[2] != 3:
                got = (
                    f"{frame.dtype} {frame.shape}" if isinstance(frame, np.ndarray) else type(frame).__name__
                )
                raise ValueError(f"frame {i} must be a uint8 array of shape (H, W, 3), got {got}")
            if frame.shape[0] < 1 or frame.shape[1] < 1:
                raise ValueError(f"frame {i} is empty: {frame.shape}")
            out.append(frame)
        height, width = size or out[0].shape[:2]
        if any(f.shape[:2] != (height, width) for f in out):
            from PIL import Image

            out = [
                f
                if f.shape[:2] == (height, width)
                else np.asarray(Image.fromarray(f).resize((width, height), Image.Resampling.BILINEAR))
                for f in out
            ]
        return out

    def check_audio(self, audio: np.ndarray | None) -> np.ndarray | None:
        """The audio to put in the prompt, or None (none given, empty, or not taken)."""
        if audio is None or not self.takes_audio:
            return None
        audio = np.asarray(audio)
        if audio.ndim != 1:
            raise ValueError(f"audio must be mono 1-D samples, got shape {audio.shape}")
        if audio.size == 0:
            return None
        if audio.size > self.max_audio_samples:
            raise ValueError(
                f"audio too long: {audio.size / self.sampling_rate:.2f} s "
                f"(limit {self.max_audio_seconds:g} s at {self.sampling_rate} Hz)"
            )
        if not np.issubdtype(audio.dtype, np.floating):
            raise ValueError(f"audio must be float samples in [-1, 1] at {self.sampling_rate} Hz, got {audio.dtype}")
        audio = audio.astype(np.float32, copy=False)
        if not np.isfinite(audio).all():
            raise ValueError("audio contains NaN or infinite samples")
        return audio

    def check_question(self, text: str, system_prompt: str | None, fps: float) -> None:
        self.check_text(text)
        self.check_setting(system_prompt, fps)

    @staticmethod
    def check_text(text: str) -> None:
        if not isinstance(text, str) or not text.strip():
            raise ValueError("text must be a non-empty string")

    @staticmethod
    def check_setting(system_prompt: str | None, fps: float) -> None:
        """What a session fixes for its questions: the system message and the frames' rate."""
        if system_prompt is not None and not isinstance(system_prompt, str):
            raise ValueError("system_prompt must be a string or None")
        if not isinstance(fps, (int, float)) or isinstance(fps, bool) or not math.isfinite(fps) or fps <= 0:
            raise ValueError(f"fps must be a positive number, got {fps!r}")

    def prompt_text(self, visual: str, with_audio: bool, text: str, system_prompt: str | None) -> str:
        """The chat-templated prompt of one query: one image or video, the audio, then the question."""
        content: list[dict[str, Any]] = [{"type": visual}]
        if with_audio:
            content.append({"type": "audio"})
        content.append({"type": "text", "text": text})
        messages: list[dict[str, Any]] = []
        if system_prompt:
            messages.append({"role": "system", "content": [{"type": "text", "text": system_prompt}]})
        messages.append({"role": "user", "content": content})
        return self.processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)

    def to_model(self, inputs: BatchFeature) -> BatchFeature:
        """Inputs on the engine's device, floating tensors in its dtype."""
        inputs.pop("num_audio_tokens", None)  # bookkeeping some processors add; the model does not take it
        return inputs.to(self.device, dtype=self.dtype) if self.dtype.is_floating_point else inputs.to(self.device)

    def video_pixels(self, frames: list[np.ndarray]) -> tuple[torch.Tensor, torch.Tensor]:
        """The video processor's patches and grid for frames of one size (as `build_inputs` makes them)."""
        out = self.processor.video_processor(
            videos=[np.stack(frames)], size=dict(self._video_size), do_sample_frames=False, return_tensors="pt"
        )
        return out["pixel_values_videos"], out["video_grid_thw"]

    def exclusive(self) -> threading.Lock:
        """The engine to oneself (`with engine.exclusive():`): model calls outside `generate` take it."""
        return self._lock

    def build_inputs(
        self,
        frames: list[np.ndarray],
        audio: np.ndarray | None,
        text: str,
        system_prompt: str | None = None,
        fps: float = 2.0,
    ) -> BatchFeature:
        """The model inputs for one query (on the engine's device and dtype).

        frames: uint8 (H, W, 3) arrays, oldest first (1..max_frames).
        audio: float32 mono samples at `sampling_rate` (16 kHz), or None;
            ignored when the model does not take audio, or empty.
        text: the user's question (non-blank).
        system_prompt: a system message; None keeps the template's default.
        fps: the rate of the given frames, for the model's time positions.
        """
        self.check_question(text, system_prompt, fps)
        frames = self.check_frames(frames)
        audio = self.check_audio(audio)

        as_image = len(frames) == 1
        prompt = self.prompt_text("image" if as_image else "video", audio is not None, text, system_prompt)

        kwargs: dict[str, Any] = {"text": [prompt], "padding": True, "return_tensors": "pt"}
        if as_image:
            kwargs["images"] = [frames[0]]
        else:
            video = np.stack(frames)  # (T, H, W, 3)
            kwargs["videos"] = [video]
            kwargs["videos_kwargs"] = {
                "size": dict(self._video_size),
                "fps": float(fps),
                "do_sample_frames": False,
                "video_metadata": [{"fps": float(fps), "total_num_frames": len(frames)}],
            }
        if audio is not None:
            kwargs["audio"] = [audio]
        return self.to_model(self.processor(**kwargs))

    # -------------------------------------------------------------- generate
    def _generate_kwargs(
        self,
        inputs: BatchFeature,
        max_new_tokens: int,
        min_new_tokens: int | None,
        stops: list[threading.Event | None],
        streamer: Any = None,
    ) -> dict[str, Any]:
        if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise ValueError("max_new_tokens must be a positive integer")
        min_new = self.min_new_tokens if min_new_tokens is None else min_new_tokens
        kwargs: dict[str, Any] = dict(
            **inputs,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            stopping_criteria=StoppingCriteriaList([_StopEvents(*stops)]),
        )
        if min_new:
            kwargs["min_new_tokens"] = min(int(min_new), max_new_tokens)
        if streamer is not None:
            kwargs["streamer"] = streamer
        return kwargs

    def answer(
        self,
        frames: list[np.ndarray],
        audio: np.ndarray | None,
        text: str,
        system_prompt: str | None = None,
        fps: float = 2.0,
        max_new_tokens: int = 64,
        min_new_tokens: int | None = None,
    ) -> str:
        """The whole greedy answer at once (same text as joining `stream_answer`)."""
        inputs = self.build_inputs(frames, audio, text, system_prompt, fps)
        kwargs = self._generate_kwargs(inputs, max_new_tokens, min_new_tokens, [])
        with self._lock, torch.inference_mode():
            out = self.model.generate(**kwargs)
        return self.tokenizer.decode(out[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)

    def stream_answer(
        self,
        frames: list[np.ndarray],
        audio: np.ndarray | None,
        text: str,
        system_prompt: str | None = None,
        fps: float = 2.0,
        max_new_tokens: int = 64,
        stop: threading.Event | None = None,
        min_new_tokens: int | None = None,
    ) -> Iterator[str]:
        """Yield the greedy answer as non-empty text deltas, as tokens come.

        This is a generator: nothing runs until the first `next()`, which
        validates and builds the inputs (bad input raises ValueError there),
        then waits for the engine lock. Setting `stop` ends generation after
        the current token and the generator then finishes; a `stop` already
        set before generation starts yields nothing.
        The generator may be advanced and closed from different threads (one
        at a time), e.g. through `asyncio.to_thread`.
        An exception inside `generate` is re-raised here. Closing the
        generator early (`close()`, or dropping it) stops generation too. The
        worker thread is always joined before the generator finishes, and the
        engine lock is held until then: consume to the end or close it.
        """
        inputs = self.build_inputs(frames, audio, text, system_prompt, fps)
        yield from self.stream_generate(lambda: inputs, max_new_tokens, min_new_tokens, stop)

    def stream_generate(
        self,
        prepare: Callable[[], dict[str, Any]],
        max_new_tokens: int,
        min_new_tokens: int | None,
        stop: threading.Event | None,
        finish: Callable[[], None] | None = None,
    ) -> Iterator[str]:
        """Greedy `generate` over what `prepare()` returns, as text deltas (see `stream_answer`).

        `prepare` runs once the engine is this caller's, and `finish` before it is released: a live
        context prefills its new tokens in the first and trims its cache in the second.
        """
        if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise ValueError("max_new_tokens must be a positive integer")
        if stop is not None and stop.is_set():
            return  # stopped before it started: no generate at all
        abandon = threading.Event()
        streamer = _TokenStreamer(self.tokenizer, skip_prompt=True, skip_special_tokens=True, timeout=_POLL_S)
        failure: list[BaseException] = []

        def run(kwargs: dict[str, Any]) -> None:
            try:
                with torch.inference_mode():
                    self.model.generate(**kwargs)
            except BaseException as exc:  # surfaced in the caller's thread
                failure.append(exc)
            finally:
                # generate() calls streamer.end() on success; after a failure
                # the consumer would otherwise wait for a stop signal forever.
                if failure:
                    streamer.text_queue.put(streamer.stop_signal)

        # Wait for the engine, but give up at once if stopped meanwhile.
        while not self._lock.acquire(timeout=_POLL_S):
            if stop is not None and stop.is_set():
                return
        try:
            if stop is not None and stop.is_set():
                return
            with torch.inference_mode():
                inputs = prepare()
            kwargs = self._generate_kwargs(inputs, max_new_tokens, min_new_tokens, [stop, abandon], streamer)
            worker = threading.Thread(target=run, args=(kwargs,), name="understanding-generate", daemon=True)
            worker.start()
            try:
                while True:
                    try:
                        piece = streamer.text_queue.get(timeout=_POLL_S)
                    except queue.Empty:
                        if not worker.is_alive() and streamer.text_queue.empty():
                            break  # ended without a stop signal (should not happen)
                        continue
                    if piece is streamer.stop_signal:
                        break
                    if piece:
                        yield piece
            finally:
                abandon.set()
                worker.join()
        finally:
            try:
                if finish is not None:
                    finish()
            finally:
                self._lock.release()
        if failure:
            raise failure[0]
