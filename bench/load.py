"""Load: N generation and M chat sessions at once against the served app for a bounded time.

Each generation worker runs sessions back to back (a few seconds of media each,
reporting playback as it stores chunks, the way `rtv generate` does); each chat
worker streams frames at 2 fps, asks a question every few seconds and waits for
the answer. Reported: sessions completed, errors by code and unexpected close
codes (protocol errors: anything a well-behaved client should never see),
p50/p99 of the interval between chunks, time to first token, and the replicas'
and ingress's resident memory before the run, after a warm-up, and at the end.

    python -m bench.load                     # 8 + 32 sessions for 60 s on the tiny models
    python -m bench.load --url ws://HOST:PORT --gen 4 --chat 8 --seconds 30
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import json
import time
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import websockets

from bench import common

EXPECTED_CLOSE = {1000}


@dataclass
class Tally:
    sessions_completed: int = 0
    chunks: int = 0
    answers: int = 0
    intervals: list[float] = field(default_factory=list)
    first_tokens: list[float] = field(default_factory=list)
    errors: Counter = field(default_factory=Counter)  # by code
    closes: Counter = field(default_factory=Counter)  # unexpected close codes

    def protocol_errors(self) -> int:
        return sum(self.errors.values()) + sum(self.closes.values())


def _jpeg(rng: np.random.Generator) -> str:
    from PIL import Image

    blocks = rng.integers(0, 256, (6, 8, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(np.kron(blocks, np.ones((20, 20, 1), np.uint8))).save(buffer, format="JPEG", quality=85)
    return base64.b64encode(buffer.getvalue()).decode()


async def _connect(url: str, headers: dict | None):
    return await websockets.connect(url, max_size=None, open_timeout=60, additional_headers=headers)


def _closed(tally: Tally, ws) -> None:
    if ws.close_code not in EXPECTED_CLOSE:
        tally.closes[str(ws.close_code)] += 1


async def generation_worker(base: str, until: float, tally: Tally, seed: int, headers: dict | None, seconds_per_session: int) -> None:
    while time.monotonic() < until:
        ws = await _connect(f"{base}/v1/realtime/video", headers)
        async with ws:
            await ws.send(json.dumps({"type": "session.start", "prompt": "a busy street", "seconds": str(seconds_per_session), "seed": seed}))
            fps = 16
            frames = 0
            last = None
            async for raw in ws:
                if isinstance(raw, bytes):
                    now = time.monotonic()
                    if last is not None:
                        tally.intervals.append(now - last)
                    last = now
                    continue
                message = json.loads(raw)
                kind = message["type"]
                if kind == "video.start":
                    fps = message.get("generation", {}).get("fps", fps)
                elif kind == "video.chunk_metadata" and message["kind"] == "media":
                    tally.chunks += 1
                    frames += message.get("fragment_frames", message["num_frames"])  # what the client holds
                    try:  # after the last chunk the server may already have closed
                        await ws.send(json.dumps({"type": "session.playback", "position_seconds": frames / fps}))
                    except websockets.ConnectionClosed:
                        pass
                elif kind == "error":
                    tally.errors[message.get("code", "none")] += 1
                elif kind == "session.done":
                    tally.sessions_completed += 1
        _closed(tally, ws)


async def chat_worker(base: str, until: float, tally: Tally, seed: int, headers: dict | None, question_every_s: float) -> None:
    rng = np.random.default_rng(seed)
    while time.monotonic() < until:
        ws = await _connect(f"{base}/v1/video/chat/stream", headers)
        async with ws:
            await ws.send(json.dumps({"type": "session.config", "max_frames": 16, "num_sample_frames": 4}))
            asked: list[float] = []  # when each question left; the reader times its first token from it
            reader = asyncio.create_task(_read_chat(ws, tally, asked))
            session_end = min(until, time.monotonic() + 3 * question_every_s)
            frame = 0
            while time.monotonic() < session_end:
                for _ in range(int(question_every_s * 2)):
                    await ws.send(json.dumps({"type": "video.frame", "data": _jpeg(rng), "frame_id": f"f{frame}", "pts_ms": frame * 500}))
                    frame += 1
                    await asyncio.sleep(0.5)
                asked.append(time.monotonic())
                await ws.send(json.dumps({"type": "video.query", "text": "What changed?"}))
            await ws.send(json.dumps({"type": "video.done"}))
            await reader
        _closed(tally, ws)


async def _read_chat(ws, tally: Tally, asked: list[float]) -> None:
    first_seen = False
    async for raw in ws:
        message = json.loads(raw)
        kind = message["type"]
        if kind == "response.start":
            first_seen = False
        elif kind == "response.text.delta" and not first_seen:
            first_seen = True
            if asked:
                tally.first_tokens.append(time.monotonic() - asked[-1])
        elif kind == "response.text.done":
            tally.answers += 1
        elif kind == "error":
            tally.errors[message.get("code", "none")] += 1
        elif kind == "session.done":
            tally.sessions_completed += 1


async def run_load(base: str, gen: int, chat: int, seconds: float, headers: dict | None = None, media_seconds: int = 3, question_every_s: float = 2.0) -> tuple[Tally, Tally]:
    """Drive the load; returns (generation tally, chat tally). `base` is ws://HOST:PORT[/prefix]."""
    until = time.monotonic() + seconds
    video, talk = Tally(), Tally()
    workers = [generation_worker(base, until, video, i, headers, media_seconds) for i in range(gen)]
    workers += [chat_worker(base, until, talk, i, headers, question_every_s) for i in range(chat)]
    results = await asyncio.gather(*workers, return_exceptions=True)
    for index, outcome in enumerate(results):
        if isinstance(outcome, Exception):
            (video if index < gen else talk).errors[f"client:{type(outcome).__name__}"] += 1
    return video, talk


def summary(video: Tally, talk: Tally, seconds: float) -> dict:
    return {
        "generation": {
            "sessions_completed": video.sessions_completed,
            "chunks": video.chunks,
            "chunk_interval": common.ms_stats(video.intervals),
            "errors_by_code": dict(video.errors),
            "unexpected_close_codes": dict(video.closes),
        },
        "chat": {
            "sessions_completed": talk.sessions_completed,
            "answers": talk.answers,
            "time_to_first_token": common.ms_stats(talk.first_tokens),
            "errors_by_code": dict(talk.errors),
            "unexpected_close_codes": dict(talk.closes),
        },
        "protocol_errors": video.protocol_errors() + talk.protocol_errors(),
        "seconds": seconds,
    }


# -- server memory ---------------------------------------------------------------------------------
def rss_of(pid: int) -> float | None:
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


async def server_pids(app_name: str) -> dict[str, int]:
    """The PIDs of the app's replicas (this machine only), from their own stats methods."""
    from ray import serve

    pids = {}
    for deployment in ("VideoIngress", "WorldModel", "Understanding"):
        try:
            pids[deployment] = (await serve.get_deployment_handle(deployment, app_name=app_name).stats.remote())["pid"]
        except Exception:  # not deployed in this app
            pass
    return pids


def memory(pids: dict[str, int]) -> dict[str, float | None]:
    return {name: None if (v := rss_of(pid)) is None else round(v, 1) for name, pid in pids.items()}


async def measured_load(base: str, app_name: str | None, gen: int, chat: int, seconds: float, warmup_s: float, headers: dict | None = None) -> dict:
    """The load run with memory read before, after the warm-up, and at the end (when the app is local)."""
    pids = await server_pids(app_name) if app_name else {}
    before = memory(pids)
    load = asyncio.ensure_future(run_load(base, gen, chat, seconds, headers))
    await asyncio.sleep(min(warmup_s, seconds))
    warm = memory(pids)
    video, talk = await load
    end = memory(pids)
    out = summary(video, talk, seconds)
    growth = {k: round(end[k] - warm[k], 1) for k in end if end[k] is not None and warm.get(k) is not None}
    out["memory_mib"] = {"before": before, "after_warmup": warm, "end": end, "growth_after_warmup": growth}
    return out


# -- the command line ------------------------------------------------------------------------------
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", help="an already running server (ws://HOST:PORT); default: start the app here")
    parser.add_argument("--gen", type=int, default=8, help="generation sessions at once")
    parser.add_argument("--chat", type=int, default=32, help="chat sessions at once")
    parser.add_argument("--seconds", type=float, default=60.0, help="how long to keep the load on")
    parser.add_argument("--warmup", type=float, default=15.0, help="memory is compared from this point on")
    parser.add_argument("--api-key", help="sent as a Bearer token")


def run(args: argparse.Namespace) -> dict:
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else None
    if args.url:
        return asyncio.run(measured_load(args.url, None, args.gen, args.chat, args.seconds, args.warmup, headers))
    from bench.served import served_app

    world = common.model_dir(args.models, "world-model")
    omni = common.model_dir(args.models, "omni")
    extra = {
        "understanding_model": str(omni),
        "max_sessions_per_replica": max(args.gen, 1),
        "max_chat_sessions_per_replica": max(args.chat, 1),
        "chat_max_new_tokens": 8,
        "chat_min_new_tokens": 4,
    }
    with served_app(world, args.torch_threads, max(args.gen, 1), extra_args=extra) as base:
        from bench.served import APP_NAME

        result = asyncio.run(measured_load(base, APP_NAME, args.gen, args.chat, args.seconds, args.warmup, headers))
    target = 8 <= args.gen and 32 <= args.chat and args.seconds >= 60
    result["targets"] = [
        common.target("protocol errors", result["protocol_errors"], 0, unit="errors"),
        common.target(
            "memory growth after warm-up, largest process",
            max(result["memory_mib"]["growth_after_warmup"].values(), default=None),
            64.0,
            unit="MiB",
            note="" if target else "a smaller run than the issue's 8 + 32 sessions for 60 s",
        ),
    ]
    return result


if __name__ == "__main__":
    raise SystemExit(common.main(__import__(__name__)))
