"""One chat session's frames on its Understanding replica, and (when live) its prefilled video.

The ingress sends every frame it retains as it arrives (`FrameIn`, numbered in the order retained)
and a question names the frames it sampled. The replica keeps the same ring as the ingress (same
capacity, same order, so the same frames), which lets a question travel without its images.

A live session (its questions see every retained frame) also keeps a `LiveContext`: between
questions, while the engine is free, `step` processes each new pair of frames and prefills it, one
pair per call so other sessions' questions wait for at most one pair. A question then answers
over the context plus the frames that came since. The context is a clip that starts at a pair
boundary, so it may reach back further than the ring: one frame when the ring's oldest frame is
the second of its pair, and up to `rebuild_after_frames` once the ring moves on. At that bound a
new context is built from the ring's oldest pair, pair by pair from the frames already processed;
questions use the old one until the new one has caught up, then the old cache is freed. The frame
rate (time positions) is measured from the frames' timestamps when a context starts and held for
its life.

No Ray here; the replica calls `add` in its event loop and `step` / the answer's generator in
worker threads, one at a time.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from deployments.media.frames import FrameBuffer, frame_rate
from deployments.understanding.engine import UnderstandingEngine
from deployments.understanding.live_context import (
    LiveContext,
    Pair,
    process_pair,
    supports_live_context,
)
from deployments.understanding.messages import FrameIn, Query


@dataclass(frozen=True)
class Answer:
    frames: int  # what the model is given
    deltas: Iterator[str]


# A context's frame rate is measured when it starts; fewer frames than this say too little about it
# (and a question over them costs little to re-read).
MIN_CONTEXT_FRAMES = 4


def _pair_start(seq: int) -> int:
    return seq - seq % 2  # pairs are the retained frames (0, 1), (2, 3), ...


def _significant(rate: float) -> float:
    return float(f"{rate:.2g}")  # timestamps jitter: hold the context to a round rate


class SessionFrames:
    def __init__(
        self,
        engine: UnderstandingEngine,
        system_prompt: str | None,
        max_frames: int,
        live: bool,
        rebuild_after_frames: int = 8,
    ) -> None:
        self.engine = engine
        self.system_prompt = system_prompt
        self.ring: FrameBuffer[FrameIn] = FrameBuffer(max_frames)
        self.live = live and supports_live_context(engine)
        self.rebuild_after_frames = max(2, rebuild_after_frames)
        self._size: tuple[int, int] | None = None  # (height, width) of the session's first frame
        self._pairs: dict[int, Pair] = {}  # processed complete pairs, by first frame, not yet in every context
        self.context: LiveContext | None = None
        self._building: LiveContext | None = None

    # ------------------------------------------------------------------ frames
    def add(self, frame: FrameIn) -> None:
        newest = self.ring.newest()
        if newest is not None and frame.seq != newest.seq + 1:
            raise ValueError(f"frames must arrive in order: expected {newest.seq + 1}, got {frame.seq}")
        if self._size is None:
            self._size = tuple(frame.image.shape[:2])
        self.ring.append(frame)

    def _head(self) -> int:
        return self.ring.frames()[0].seq

    def _newest(self) -> int:
        return self.ring.newest().seq

    def _image(self, seq: int) -> np.ndarray | None:
        frames = self.ring.frames()
        index = seq - frames[0].seq if frames else -1
        return frames[index].image if 0 <= index < len(frames) else None

    def _pair(self, first_seq: int, complete_only: bool = True) -> Pair | None:
        """The processed pair starting at `first_seq`, processing it now when its frames are here."""
        if first_seq in self._pairs:
            return self._pairs[first_seq]
        images = [self._image(first_seq), self._image(first_seq + 1)]
        if images[0] is None or (complete_only and images[1] is None):
            return None
        pair = process_pair(self.engine, first_seq, [i for i in images if i is not None], self._size)
        if pair.complete:
            self._pairs[first_seq] = pair
        return pair

    # ---------------------------------------------------------------- prefill
    def has_work(self) -> bool:
        if not self.live or len(self.ring) < MIN_CONTEXT_FRAMES:
            return False
        if self.context is None or self._building is not None or self._lag() >= self.rebuild_after_frames:
            return True
        return self.context.next_seq + 1 <= self._newest()

    def _lag(self) -> int:
        """Frames the context holds that the ring no longer does."""
        return self._head() - self.context.first_seq if self.context is not None else 0

    def _available(self, first_seq: int) -> bool:
        return first_seq in self._pairs or self._image(first_seq) is not None

    def _new_context(self) -> LiveContext:
        """A context from the ring's oldest pair (from the next one when that pair's first frame is gone)."""
        frames = self.ring.frames()
        start = _pair_start(frames[0].seq)
        if not self._available(start):
            start += 2
        rate = frame_rate([f.pts_ms for f in frames])
        return LiveContext(self.engine, self.system_prompt, _significant(rate), start)

    def step(self) -> bool:
        """One unit of prefill: start a context, or process and prefill one pair. False when none was due."""
        if not self.has_work():
            return False
        if self.context is None:
            self.context = self._new_context()
        elif self._building is None and self._lag() >= self.rebuild_after_frames:
            self._building = self._new_context()
        target = self._building or self.context
        if target.next_seq + 1 > self._newest():
            return self._finish_building()
        pair = self._pair(target.next_seq)
        if pair is None:  # its frames left the ring before it was prefilled: start over from the ring
            if self._building is not None:
                self._building.release()
            self._building = self._new_context()
            return True
        with self.engine.exclusive():
            target.extend(pair)
        self._finish_building()
        self._prune()
        return True

    def _finish_building(self) -> bool:
        building = self._building
        if building is None or building.next_seq < min(self.context.next_seq, _pair_start(self._newest() + 1)):
            return building is not None
        self.context.release()
        self.context, self._building = building, None
        self._prune()
        return True

    def _prune(self) -> None:
        # Keep what a context still has to prefill, and every pair the ring overlaps (a rebuild starts there).
        keep_from = min([c.next_seq for c in (self.context, self._building) if c is not None] + [_pair_start(self._head())])
        for first_seq in [s for s in self._pairs if s < keep_from]:
            del self._pairs[first_seq]

    # ----------------------------------------------------------------- answer
    def answer(self, query: Query, max_new_tokens: int, min_new_tokens: int | None, stop) -> Answer:
        """The question's answer stream; the work happens as it is consumed (in a worker thread)."""
        ring = self.ring.frames()
        seqs = [f.seq for f in ring]
        if list(query.frame_seqs) == seqs and self._live_ready():
            context = self.context
            newest = seqs[-1]
            return Answer(newest - context.first_seq + 1, self._live_deltas(context, query, max_new_tokens, min_new_tokens, stop))
        images = [self._image(seq) for seq in query.frame_seqs]
        if not images or any(image is None for image in images):
            raise ValueError(f"the question names frames this replica does not hold: {list(query.frame_seqs)}")
        deltas = self.engine.stream_answer(
            images,
            query.audio,
            query.text,
            system_prompt=self.system_prompt,
            fps=query.fps,
            max_new_tokens=max_new_tokens,
            min_new_tokens=min_new_tokens,
            stop=stop,
        )
        return Answer(len(images), deltas)

    def _live_ready(self) -> bool:
        """A context that covers the ring, and every frame after it still here (or processed)."""
        if not self.live or len(self.ring) < MIN_CONTEXT_FRAMES:
            return False
        if self.context is None:
            self.context = self._new_context()
        if self.context.first_seq > self._head():
            return False
        return all(self._available(seq) for seq in range(self.context.next_seq, self._newest() + 1, 2))

    def _live_deltas(self, context: LiveContext, query: Query, max_new_tokens: int, min_new_tokens, stop) -> Iterator[str]:
        pending: list[Pair] = []
        seq, newest = context.next_seq, self._newest()
        while seq <= newest:
            pending.append(self._pair(seq, complete_only=False))
            seq += 2
        yield from context.stream_answer(pending, query.audio, query.text, max_new_tokens, min_new_tokens, stop)
        self._prune()

    # ------------------------------------------------------------------ state
    def nbytes(self) -> int:
        """Bytes of cached keys and values this session holds."""
        return sum(c.nbytes() for c in (self.context, self._building) if c is not None)

    def describe(self) -> dict:
        context = self.context
        return {
            "frames": len(self.ring),
            "live": self.live,
            "context_frames": context.frames if context is not None else 0,
            "context_first_frame": context.first_seq if context is not None else None,
            "rebuilding": self._building is not None,
            "context_bytes": self.nbytes(),
        }

    def close(self) -> None:
        for context in (self.context, self._building):
            if context is not None:
                context.release()
        self.context = self._building = None
        self._pairs.clear()
        self.ring.clear()
