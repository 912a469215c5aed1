"""A chat session's video, prefilled into the language model's KV cache as its frames arrive.

Why: a question that re-reads every buffered frame pays, at every question, for the processor,
the vision tower and the prefill over all of them, so its time to first token grows with the
frames. A live session's frames arrive one by one. Here each temporal patch (two frames: Qwen's
`temporal_patch_size`) is processed, vision-encoded and prefilled once, into the session's own
cache; a question then pays for its own text, its audio and the few frames that came since.

It is exact, not an approximation of the re-read:
- the prompt is the engine's own (`UnderstandingEngine.prompt_text`: system turn, one video, the
  audio, the question), split at the video placeholder; the part before the video is the same for
  every question of a session, and special tokens tokenize alone, so the pieces' ids join to the
  whole prompt's ids;
- the vision tower attends within one temporal patch at a time, so a pair processed and encoded
  alone gives the same features as inside the whole clip;
- positions come from the model's own `get_rope_index` over the whole prompt; the video's time
  positions depend only on the pair's index and the frame rate, which a context fixes when it
  starts;
- a causal model's keys and values for a prefix do not depend on what follows it.
So an answer equals the re-read answer over the context's frames at the context's frame rate (the
tests compare the tokens). `generate` still does the decoding, so a checkpoint's generation config
(eos ids, penalties) applies as on the re-read path.

Only the Qwen2.5-Omni thinker family (the model the app serves); other checkpoints re-read.
The caller serializes engine work: `extend` and the answer's prefill run under the engine's lock.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch
from transformers import DynamicCache

from deployments.understanding.engine import UnderstandingEngine

__all__ = ["LiveContext", "Pair", "process_pair", "supports_live_context"]

LIVE_MODEL_TYPES = ("qwen2_5_omni_thinker", "qwen2_5_omni")


def supports_live_context(engine: UnderstandingEngine) -> bool:
    return engine.model_type in LIVE_MODEL_TYPES and hasattr(engine.model, "get_rope_index")


@dataclass(frozen=True)
class Pair:
    """One temporal patch of the session's video, processed: two consecutive frames, or the newest alone."""

    first_seq: int  # the session's retained-frame number of its first frame
    frames: int  # 2, or 1 when its partner has not arrived (the processor repeats the frame)
    pixels: torch.Tensor
    grid: torch.Tensor  # (1, 3): one temporal patch, then the patch grid's height and width

    @property
    def complete(self) -> bool:
        return self.frames == 2


def process_pair(engine: UnderstandingEngine, first_seq: int, frames: list[np.ndarray], size: tuple[int, int]) -> Pair:
    """Run the processor over one or two frames, resized to the session's frame size (height, width).

    Thread-safe (only the processor); the result is what the same frames give inside a whole clip.
    """
    if len(frames) not in (1, 2):
        raise ValueError(f"a pair holds one or two frames, got {len(frames)}")
    pixels, grid = engine.video_pixels(engine.check_frames(frames, size))
    return Pair(first_seq, len(frames), pixels, grid)


class LiveContext:
    """The session's video so far, in the language model's cache: system turn, user turn, pairs."""

    def __init__(self, engine: UnderstandingEngine, system_prompt: str | None, fps: float, first_seq: int) -> None:
        if not supports_live_context(engine):
            raise ValueError(f"a live context needs a Qwen2.5-Omni thinker, not {engine.model_type}")
        engine.check_setting(system_prompt, fps)
        self.engine = engine
        self.system_prompt = system_prompt
        self.fps = float(fps)
        self.first_seq = first_seq  # the first frame of the context's first pair
        self.next_seq = first_seq  # the frame after its last prefilled pair
        model = engine.model
        self._merge = model.config.vision_config.spatial_merge_size
        self._second_per_grid = model.config.vision_config.temporal_patch_size / self.fps
        self._video_token_id = model.config.video_token_index
        # What comes before the video is the same for every question: any text stands in for it here.
        head, _ = self._split(engine.prompt_text("video", False, "?", system_prompt))
        self._head_ids = engine.tokenizer(head, return_tensors="pt")["input_ids"].to(engine.device)
        # Closes the video when positions are laid out for a pair alone (nothing after it is prefilled).
        eos = engine.tokenizer.convert_tokens_to_ids(engine.processor.vision_eos_token)
        self._video_end = torch.tensor([[eos]], device=engine.device)
        self.cache = DynamicCache(config=model.config.get_text_config())
        self.length = 0  # tokens in the cache: the head, then every prefilled pair
        self.pairs = 0
        self._grid_hw: tuple[int, int] | None = None

    @property
    def frames(self) -> int:
        return self.next_seq - self.first_seq

    def nbytes(self) -> int:
        total = 0
        for layer in self.cache.layers:
            for tensor in (getattr(layer, "keys", None), getattr(layer, "values", None)):
                if isinstance(tensor, torch.Tensor):
                    total += tensor.numel() * tensor.element_size()
        return total

    def release(self) -> None:
        self.cache = DynamicCache(config=self.engine.model.config.get_text_config())
        self.length = self.pairs = 0
        self.next_seq = self.first_seq

    def _trim(self, length: int) -> None:
        extra = self.cache.get_seq_length() - length
        if extra > 0:
            self.cache.crop(-extra)  # transformers 5: a negative count removes that many from the end

    # ------------------------------------------------------------------ layout
    def _split(self, prompt: str) -> tuple[str, str]:
        head, sep, tail = prompt.partition(self.engine.processor.video_token)
        if not sep:
            raise ValueError("the chat template put no video placeholder in the prompt")
        return head, tail

    def _tokens_per_pair(self) -> int:
        height, width = self._grid_hw
        return height * width // self._merge**2

    def _check_grid(self, pairs: list[Pair]) -> None:
        for pair in pairs:
            hw = (int(pair.grid[0, 1]), int(pair.grid[0, 2]))
            if self._grid_hw is None:
                self._grid_hw = hw
            elif hw != self._grid_hw:
                raise ValueError(f"pair at frame {pair.first_seq} has patch grid {hw}, the context {self._grid_hw}")

    def _layout(self, pairs: int, tail_ids: torch.Tensor, audio_lengths: torch.Tensor | None):
        """The whole prompt's ids, its 3-D positions and the rope delta that continues them."""
        video = torch.full((1, pairs * self._tokens_per_pair()), self._video_token_id, dtype=torch.long, device=self.engine.device)
        ids = torch.cat([self._head_ids, video, tail_ids], dim=1)
        height, width = self._grid_hw
        grid = torch.tensor([[pairs, height, width]], device=self.engine.device)
        positions, delta = self.engine.model.get_rope_index(
            ids, None, grid, torch.ones_like(ids), False, audio_lengths, torch.tensor([self._second_per_grid])
        )
        return ids, positions, delta

    def _forward(self, ids: torch.Tensor, positions: torch.Tensor, pairs: list[Pair], audio: dict | None = None) -> None:
        kwargs: dict = {}
        if pairs:
            kwargs["pixel_values_videos"] = torch.cat([p.pixels for p in pairs]).to(self.engine.device)
            height, width = self._grid_hw
            kwargs["video_grid_thw"] = torch.tensor([[len(pairs), height, width]], device=self.engine.device)
        if audio is not None:
            kwargs.update(audio)
        self.engine.model.model(input_ids=ids, position_ids=positions, cache=self.cache, use_cache=True, **kwargs)

    # ---------------------------------------------------------------- prefill
    def extend(self, pair: Pair) -> None:
        """Prefill the next complete pair (call with the engine held: `engine.exclusive()`)."""
        if not pair.complete:
            raise ValueError("only a complete pair joins the context")
        if pair.first_seq != self.next_seq:
            raise ValueError(f"the context expects the pair at frame {self.next_seq}, got {pair.first_seq}")
        self._check_grid([pair])
        ids, positions, _ = self._layout(self.pairs + 1, self._video_end, None)
        with torch.inference_mode():
            start = self.length  # 0 on the first pair: the head goes in with it
            end = ids.shape[1] - 1  # up to the pair's last token, not the closing eos
            try:
                self._forward(ids[:, start:end], positions[:, :, start:end], [pair])
            except BaseException:
                self._trim(self.length)
                raise
        self.length = end
        self.pairs += 1
        self.next_seq += 2

    # ----------------------------------------------------------------- answer
    def stream_answer(
        self,
        pending: list[Pair],
        audio: np.ndarray | None,
        text: str,
        max_new_tokens: int = 64,
        min_new_tokens: int | None = None,
        stop=None,
    ) -> Iterator[str]:
        """The answer over the context's frames, then `pending` (newer pairs), the audio and `text`.

        A generator like `UnderstandingEngine.stream_answer`. The complete pending pairs stay in the
        context afterwards; the question, the answer and a lone newest frame do not.
        """
        self.engine.check_text(text)
        audio = self.engine.check_audio(audio)
        expected = self.next_seq
        for pair in pending:
            if pair.first_seq != expected:
                raise ValueError(f"pending pairs must follow the context: expected frame {expected}, got {pair.first_seq}")
            expected += pair.frames
        if any(not p.complete for p in pending[:-1]):
            raise ValueError("only the newest pending pair may hold a single frame")
        if self.pairs + len(pending) < 1:
            raise ValueError("a live context answers over at least one pair of frames")
        self._check_grid(pending)
        _, tail_text = self._split(self.engine.prompt_text("video", audio is not None, text, self.system_prompt))
        tail = self.engine.to_model(
            self.engine.processor(text=[tail_text], audio=[audio] if audio is not None else None, return_tensors="pt")
        )
        audio_inputs = None
        audio_lengths = None
        if audio is not None:
            audio_inputs = {"input_features": tail["input_features"], "feature_attention_mask": tail["feature_attention_mask"]}
            audio_lengths = tail["feature_attention_mask"].sum(-1)
        kept = {"length": self.length}

        def prepare() -> dict:
            ids, positions, delta = self._layout(self.pairs + len(pending), tail["input_ids"], audio_lengths)
            start, last = self.length, ids.shape[1] - 1
            # Everything new but the last token: `generate` feeds that one and carries on from it.
            self._forward(ids[:, start:last], positions[:, :, start:last], pending, audio_inputs)
            complete = self.pairs + sum(p.complete for p in pending)
            kept["length"] = self._head_ids.shape[1] + complete * self._tokens_per_pair()
            self.engine.model.model.rope_deltas = delta  # what `generate` continues the positions with
            return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "cache": self.cache}

        def finish() -> None:
            self._trim(kept["length"])
            if kept["length"] > self.length:
                complete = sum(p.complete for p in pending)
                self.pairs += complete
                self.next_seq += 2 * complete
                self.length = kept["length"]
        yield from self.engine.stream_generate(prepare, max_new_tokens, min_new_tokens, stop, finish)
