"""A live context answers exactly as a re-read of the same frames, while prefilling only what is new."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from deployments.understanding.engine import UnderstandingEngine
from deployments.understanding.live_context import LiveContext, process_pair
from deployments.understanding.messages import FrameIn, Query
from deployments.understanding.session_frames import SessionFrames

pytestmark = pytest.mark.timeout(180)

SIZE = (56, 84)  # height, width: 2x3 merged cells per frame
MAX_NEW = 12


@pytest.fixture(scope="module")
def engine(omni_dir) -> UnderstandingEngine:
    return UnderstandingEngine.from_pretrained(omni_dir, min_new_tokens=MAX_NEW)  # random weights: force the length


def frames_of(n: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, size=(*SIZE, 3), dtype=np.uint8) for _ in range(n)]


def audio_of(seconds: float) -> np.ndarray:
    return (0.1 * np.random.default_rng(3).standard_normal(int(16_000 * seconds))).astype(np.float32)


def pairs_of(engine, frames, first_seq=0):
    return [process_pair(engine, first_seq + i, frames[i : i + 2], SIZE) for i in range(0, len(frames), 2)]


def live_answer(context: LiveContext, pending, audio, text) -> str:
    return "".join(context.stream_answer(pending, audio, text, max_new_tokens=MAX_NEW))


def reread(engine, frames, audio, text, fps, system_prompt=None) -> str:
    return "".join(engine.stream_answer(frames, audio, text, system_prompt, fps, max_new_tokens=MAX_NEW))


def test_a_pair_processed_alone_is_the_same_as_inside_the_clip(engine):
    frames = frames_of(5)
    whole, grid = engine.video_pixels(frames)
    pieces = pairs_of(engine, frames)
    assert torch.equal(torch.cat([p.pixels for p in pieces]), whole)
    assert [p.frames for p in pieces] == [2, 2, 1] and int(grid[0, 0]) == 3
    with torch.inference_mode():
        encode = engine.model.model.get_video_features
        alone = torch.cat([encode(p.pixels, p.grid).pooler_output[0] for p in pieces])
        together = encode(whole, grid).pooler_output[0]
    torch.testing.assert_close(alone, together, rtol=0, atol=1e-5)


@pytest.mark.parametrize("cached,frames,with_audio", [(3, 8, False), (2, 7, True), (0, 5, True), (4, 8, True)])
def test_the_answer_is_the_reread_answer(engine, cached, frames, with_audio):
    video = frames_of(frames, seed=frames)
    audio = audio_of(1.5) if with_audio else None
    pairs = pairs_of(engine, video)
    context = LiveContext(engine, None, fps=2.5, first_seq=0)
    with engine.exclusive():
        for pair in pairs[:cached]:
            context.extend(pair)
    live = live_answer(context, pairs[cached:], audio, "What changed?")
    assert live and live == reread(engine, video, audio, "What changed?", fps=2.5)
    # The complete pending pairs joined the context, the lone newest frame did not.
    assert context.frames == frames - frames % 2


def test_questions_share_the_context_and_new_frames_extend_it(engine):
    video = frames_of(10, seed=4)
    pairs = pairs_of(engine, video)
    context = LiveContext(engine, "Answer briefly.", fps=2.0, first_seq=0)
    with engine.exclusive():
        for pair in pairs[:3]:
            context.extend(pair)
    length = context.length
    first = live_answer(context, [], None, "Who is there?")
    assert context.length == length  # the question and the answer left the cache
    assert first == reread(engine, video[:6], None, "Who is there?", 2.0, "Answer briefly.")
    second = live_answer(context, pairs[3:], None, "And now?")
    assert second == reread(engine, video, None, "And now?", 2.0, "Answer briefly.")
    assert context.frames == 10 and context.length > length


def test_a_context_that_starts_later_in_the_stream(engine):
    video = frames_of(8, seed=5)
    pairs = pairs_of(engine, video, first_seq=40)
    context = LiveContext(engine, None, fps=2.0, first_seq=40)
    with engine.exclusive():
        for pair in pairs[:2]:
            context.extend(pair)
    assert live_answer(context, pairs[2:], None, "Where?") == reread(engine, video, None, "Where?", 2.0)


def test_bad_input_names_what_was_wrong_and_leaves_the_context_usable(engine):
    video = frames_of(6, seed=6)
    pairs = pairs_of(engine, video)
    context = LiveContext(engine, None, fps=2.0, first_seq=0)
    with engine.exclusive():
        context.extend(pairs[0])
    with pytest.raises(ValueError, match="expects the pair at frame 2"):
        context.extend(pairs[2])
    with pytest.raises(ValueError, match="pending pairs must follow the context"):
        list(context.stream_answer([pairs[2]], None, "Hi?"))
    with pytest.raises(ValueError, match="non-empty"):
        list(context.stream_answer([], None, "  "))
    other_size = process_pair(engine, 2, frames_of(2)[:2], (112, 112))
    with pytest.raises(ValueError, match="patch grid"):
        list(context.stream_answer([other_size], None, "Hi?"))
    with pytest.raises(ValueError, match="Qwen2.5-Omni"):
        fake = type("Fake", (), {"model_type": "qwen2_vl", "model": engine.model})()
        LiveContext(fake, None, 2.0, 0)
    assert live_answer(context, pairs[1:], None, "Still there?") == reread(engine, video, None, "Still there?", 2.0)


def test_a_stopped_answer_keeps_the_context_consistent(engine):
    video = frames_of(6, seed=7)
    pairs = pairs_of(engine, video)
    context = LiveContext(engine, None, fps=2.0, first_seq=0)
    stop = threading.Event()
    stream = context.stream_answer(pairs[:2], None, "Go on?", max_new_tokens=MAX_NEW, stop=stop)
    assert next(stream)
    stop.set()
    list(stream)
    assert context.frames == 4 and context.length == context.cache.get_seq_length()
    assert context.nbytes() > 0
    assert live_answer(context, pairs[2:], None, "Next?") == reread(engine, video, None, "Next?", 2.0)
    context.release()
    assert context.nbytes() == 0 and context.frames == 0


# -- the session's frames on the replica ---------------------------------------------------------


def feed(session: SessionFrames, frames, first_seq=0, every_ms=500.0, step=True):
    for i, image in enumerate(frames):
        session.add(FrameIn(first_seq + i, image, (first_seq + i) * every_ms))
        while step and session.step():
            pass


def ask(session: SessionFrames, seqs, text="What now?", fps=2.0):
    answer = session.answer(Query("q", text, tuple(seqs), fps), MAX_NEW, None, None)
    return answer.frames, "".join(answer.deltas)


def test_a_live_session_prefills_as_frames_arrive_and_answers_over_them(engine):
    video = frames_of(11, seed=8)
    session = SessionFrames(engine, None, max_frames=64, live=True)
    feed(session, video)
    assert not session.has_work()
    assert session.context.frames == 10 and session.context.fps == 2.0  # the lone newest frame waits for its partner
    frames, text = ask(session, range(11))
    assert frames == 11 and text == reread(engine, video, None, "What now?", 2.0)
    assert session.nbytes() > 0
    session.close()
    assert session.nbytes() == 0 and len(session.ring) == 0


def test_the_context_follows_the_ring_within_the_rebuild_bound(engine):
    video = frames_of(40, seed=9)
    session = SessionFrames(engine, None, max_frames=8, live=True, rebuild_after_frames=4)
    sizes = []
    for i in range(len(video)):
        feed(session, video[i : i + 1], first_seq=i)
        head = session.ring.frames()[0].seq
        # Stepped to the end after each frame: a rebuild due has finished, so the lag is under the bound.
        assert i < 3 or (session._building is None and head - session.context.first_seq < 4)
        sizes.append(session.nbytes())
        if i in (9, 23, 39):
            ring = [f.seq for f in session.ring.frames()]
            frames, text = ask(session, ring)
            first = session.context.first_seq
            assert frames == i - first + 1 and first <= ring[0]
            assert text == reread(engine, video[first : i + 1], None, "What now?", 2.0)
    assert max(sizes) <= 2 * sizes[9]  # bounded: one context of the ring and the rebound, and a rebuild


def test_questions_over_a_sample_reread_the_named_frames(engine):
    video = frames_of(9, seed=10)
    live = SessionFrames(engine, "Be short.", max_frames=16, live=True)
    sampled = SessionFrames(engine, "Be short.", max_frames=16, live=False)
    feed(live, video)
    feed(sampled, video)
    assert sampled.context is None and not sampled.has_work()
    expected = reread(engine, [video[i] for i in (0, 4, 8)], None, "What now?", 1.5, "Be short.")
    assert ask(live, (0, 4, 8), fps=1.5) == (3, expected)  # not every frame: the re-read, even when live
    assert ask(sampled, (0, 4, 8), fps=1.5) == (3, expected)
    with pytest.raises(ValueError, match="does not hold"):
        ask(sampled, (0, 99))
    with pytest.raises(ValueError, match="in order"):
        sampled.add(FrameIn(3, video[0]))
    # Too few frames for a context: a two-frame question is re-read.
    short = SessionFrames(engine, None, max_frames=16, live=True)
    feed(short, video[:2])
    assert short.context is None and ask(short, (0, 1), fps=2.0) == (2, reread(engine, video[:2], None, "What now?", 2.0))
