"""Bench 6, understanding: time to first token against the number of frames a question sees.

In this process, on the tiny Omni thinker, frames of 448x252 (what the web
page sends; the chat session keeps frames no larger), the calls the
Understanding replica makes:
- live: a session whose questions see every retained frame
  (`SessionFrames`, live). Its frames are added one by one with the prefill
  steps the replica runs between questions (`step`, timed per pair), then the
  question is asked. This is what the target measures.
- re-read: the same frames given to `UnderstandingEngine.stream_answer` at
  every question (a session that samples its ring). Where that time goes: the
  processor (`build_inputs`, timed in a separate call), the vision tower
  (hooks on `visual`), the rest (prefill and the first decode step).
Counts run in rounds (4, 16, 64, 4, ...) so drift hits each alike. Time to
first token = from asking for the first text delta to getting it.
"""

from __future__ import annotations

import time

import numpy as np

from bench import common

QUESTION = "What is moving?"
SERVED_SAMPLE_FRAMES = 16  # PROTOCOL.md's default num_sample_frames: what a default query sees of the ring


def add_arguments(parser) -> None:
    parser.add_argument("--frames", type=lambda t: [int(n) for n in t.split(",")], default=[4, 16, 64], help="comma-separated")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--size", type=common.parse_size, default=(448, 252), help="WxH of each frame")
    parser.add_argument("--max-new-tokens", type=int, default=4)


class _Stopwatch:
    """Seconds spent inside one module's forward calls (pre and post hooks), summed since the last reset."""

    def __init__(self, module) -> None:
        self.seconds = 0.0
        self._began = 0.0
        self._hooks = [module.register_forward_pre_hook(self._pre), module.register_forward_hook(self._post)]

    def _pre(self, module, args) -> None:
        self._began = time.perf_counter()

    def _post(self, module, args, output) -> None:
        self.seconds += time.perf_counter() - self._began

    def take(self) -> float:
        seconds, self.seconds = self.seconds, 0.0
        return seconds

    def remove(self) -> None:
        for hook in self._hooks:
            hook.remove()


def frames_of(count: int, size: tuple[int, int]) -> list[np.ndarray]:
    from deployments.media.testclips import clip_frame

    return [clip_frame(i, 2.0, size) for i in range(count)]


def ask(engine, frames, max_new_tokens: int, vision: _Stopwatch | None) -> dict:
    """One question: the processor alone, then time to first token of the streamed answer and its split."""
    began = time.perf_counter()
    inputs = engine.build_inputs(frames, None, QUESTION)
    processor_s = time.perf_counter() - began
    if vision is not None:
        vision.take()
    stream = engine.stream_answer(frames, None, QUESTION, max_new_tokens=max_new_tokens)
    began = time.perf_counter()
    next(stream)
    first_s = time.perf_counter() - began
    vision_s = vision.take() if vision is not None else None
    for _ in stream:
        pass
    return {"ttft_s": first_s, "processor_s": processor_s, "vision_s": vision_s, "prompt_tokens": int(inputs["input_ids"].shape[1])}


def ask_live(engine, frames, max_new_tokens: int) -> dict:
    """A live session fed frame by frame with its prefill steps, then one question over every frame."""
    from deployments.understanding.messages import FrameIn, Query
    from deployments.understanding.session_frames import SessionFrames

    session = SessionFrames(engine, None, max_frames=len(frames), live=True)
    steps = []
    for seq, image in enumerate(frames):
        session.add(FrameIn(seq, image, seq * 500.0))
        while True:
            began = time.perf_counter()
            if not session.step():
                break
            steps.append(time.perf_counter() - began)
    answer = session.answer(Query("bench", QUESTION, tuple(range(len(frames))), 2.0), max_new_tokens, None, None)
    began = time.perf_counter()
    next(answer.deltas)
    first_s = time.perf_counter() - began
    for _ in answer.deltas:
        pass
    session.close()
    return {"ttft_s": first_s, "prefill_step_s": common.median(steps), "context_frames": answer.frames}


def run(args) -> dict:
    from deployments.understanding.engine import UnderstandingEngine

    threads = common.set_torch_threads(args.torch_threads)
    engine = UnderstandingEngine.from_pretrained(common.model_dir(args.models, "omni"), max_frames=max(args.frames),
                                                 min_new_tokens=args.max_new_tokens)  # random weights may stop at once
    visual = getattr(getattr(engine.model, "model", engine.model), "visual", None)
    vision = _Stopwatch(visual) if visual is not None else None
    clips = {n: frames_of(n, args.size) for n in args.frames}
    samples: dict[int, list[dict]] = {n: [] for n in args.frames}
    live: dict[int, list[dict]] = {n: [] for n in args.frames}
    try:
        ask(engine, clips[args.frames[0]], args.max_new_tokens, vision)  # warm-up
        ask_live(engine, clips[args.frames[0]], args.max_new_tokens)
        for _ in range(args.rounds):
            for n in args.frames:
                live[n].append(ask_live(engine, clips[n], args.max_new_tokens))
                samples[n].append(ask(engine, clips[n], args.max_new_tokens, vision))
    finally:
        if vision is not None:
            vision.remove()

    reread, streamed = {}, {}
    for n, rows in samples.items():
        ttft = common.median([r["ttft_s"] for r in rows])
        processor = common.median([r["processor_s"] for r in rows])
        vision_s = common.median([r["vision_s"] for r in rows]) if vision is not None else None
        reread[str(n)] = {
            "ttft_ms": common.ms(ttft),
            "processor_ms": common.ms(processor),
            "vision_ms": common.ms(vision_s),
            "prefill_and_first_token_ms": common.ms(ttft - processor - (vision_s or 0.0)),
            "prompt_tokens": rows[0]["prompt_tokens"],
        }
        streamed[str(n)] = {
            "ttft_ms": common.ms(common.median([r["ttft_s"] for r in live[n]])),
            "prefill_per_pair_ms": common.ms(common.median([r["prefill_step_s"] for r in live[n] if r["prefill_step_s"]])),
            "frames_seen": live[n][0]["context_frames"],
        }
    low, high = str(min(args.frames)), str(max(args.frames))
    value = common.ratio(streamed[high]["ttft_ms"], streamed[low]["ttft_ms"])
    served = str(min(max(args.frames), SERVED_SAMPLE_FRAMES))
    return {
        "results": {
            "torch_threads": threads,
            "frame_size": list(args.size),
            "live_by_frames": streamed,
            "reread_by_frames": reread,
            f"ttft_{high}_over_{low}": value,
            f"reread_ttft_{high}_over_{low}": common.ratio(reread[high]["ttft_ms"], reread[low]["ttft_ms"]),
            # With PROTOCOL's default num_sample_frames (16), a question over a full ring of 64 sees 16 of them (re-read).
            f"reread_ttft_{served}_over_{low}_default_sampling": common.ratio(reread.get(served, {}).get("ttft_ms"), reread[low]["ttft_ms"]),
            f"live_over_reread_ttft_{high}": common.ratio(streamed[high]["ttft_ms"], reread[high]["ttft_ms"]),
        },
        "targets": [common.target(f"time to first token, {high} frames / {low} frames", value, 1.5,
                                  note="live session: every retained frame in the question, prefilled as frames arrived")],
    }


if __name__ == "__main__":
    import sys

    raise SystemExit(common.main(sys.modules[__name__]))
