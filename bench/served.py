"""The served path for benchmarks: the app on a local Ray + Serve, and timed WebSocket sessions against it.

`served_app` does what `serve run serve_config.yaml` does (build the app from
an `AppConfig`, `serve.run` it behind Serve's HTTP proxy, or with `ingress`
"haproxy" as `make serve` runs it: direct ingress behind HAProxy), in this
process so the benchmark controls the port, the torch threads and the
teardown. Given a `url` it starts nothing and uses that server (tests share
their own Ray).
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from bench import common

APP_NAME = "bench"


def app_args(world_model: Path, torch_threads: int, max_sessions: int) -> dict:
    """One WorldModel replica holding up to `max_sessions` sessions, no understanding model, CPU only."""
    return {
        "model": str(world_model),
        "build_tiny_models": False,
        "accelerator": "cpu",
        "num_replicas": 1,
        "max_sessions_per_replica": max_sessions,
        "torch_threads": torch_threads,  # Ray would otherwise give the replica 1 thread and the comparison would lie
        "understanding_model": None,
        "replica_cpus": 0,
    }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def served_app(world_model: Path, torch_threads: int, max_sessions: int = 8, url: str | None = None, extra_args: dict | None = None,
               ingress: str = "proxy") -> Iterator[str]:
    """Yield the ws:// base URL of the app; start (and afterwards stop) Ray + Serve unless `url` is given.
    `ingress`: "proxy" (Serve's Python proxy) or "haproxy" (as `make serve`; the proxy where no binary exists)."""
    if url:
        yield url
        return
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the replicas inherit it: nothing is ever downloaded
    from deployments.fast_ingress import CHOICE, serve_environment

    # Serve reads its ingress flags when Ray starts its processes, from this process's environment.
    env, line = serve_environment({**os.environ, CHOICE: ingress})
    os.environ.update(env)
    common.log(f"served_app: {line}")
    import ray
    from ray import serve

    from deployments.app import build_app

    own_ray = not ray.is_initialized()
    if own_ray:
        # address="local": always a fresh cluster of our own, never one someone else started with `ray start`.
        # worker_niceness 0: Ray starts workers at nice 15, which changes nothing on a machine of its own but,
        # on a shared one, would slow the replica against other users' work and not the in-process side.
        ray.init(address="local", num_cpus=8, include_dashboard=False, log_to_driver=False,
                 _system_config={"worker_niceness": 0})
    port = _free_port()
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(build_app({**app_args(world_model, torch_threads, max_sessions), **(extra_args or {})}), name=APP_NAME, route_prefix="/")
        yield f"ws://127.0.0.1:{port}"
    finally:
        try:
            serve.delete(APP_NAME)
        finally:
            if own_ray:
                serve.shutdown()
                ray.shutdown()


def replica_block_seconds(prompt: str, blocks: int, size: tuple[int, int], seed: int) -> float | None:
    """Seconds per block of the replica's own engine, called through a handle (no ingress, WebSocket or encode).

    Only for an app `served_app` started itself (None otherwise): it tells an engine slowed down inside
    the replica process apart from time spent carrying chunks to the client.
    """
    import ray
    from ray import serve

    from deployments.contract.session_spec import SessionSpec

    if not ray.is_initialized() or APP_NAME not in serve.status().applications:
        return None
    handle = serve.get_deployment_handle("WorldModel", APP_NAME)
    width, height = size
    request = SessionSpec(session_id=uuid.uuid4().hex, prompt=prompt, height=height, width=width, fps=16, seed=seed)
    began = time.perf_counter()
    handle.rollout_latents.remote(request, blocks).result()
    return (time.perf_counter() - began) / blocks


@dataclass
class TimedSession:
    """One WebSocket session as the client saw it, on this process's perf_counter clock."""

    started_at: float  # when session.start was sent
    chunk_at: list[float] = field(default_factory=list)  # arrival of each media chunk's binary frame
    chunk_frames: list[int] = field(default_factory=list)
    # Per media chunk: arrival here minus the replica's `frames_ready_at` stamp (one host, one clock).
    overhead_s: list[float] = field(default_factory=list)
    # The same split by the stamps along the way: {"replica": [...], "to_ingress": [...], "to_client": [...]}.
    stages_s: dict[str, list[float]] = field(default_factory=dict)
    error: str | None = None

    def stage_stats(self) -> dict:
        return {stage: common.ms_stats(values) for stage, values in self.stages_s.items()}

    @property
    def first_chunk_s(self) -> float | None:
        return self.chunk_at[0] - self.started_at if self.chunk_at else None

    @property
    def intervals_s(self) -> list[float]:
        """Between consecutive media chunks: chunk k's interval is the time from chunk k-1 to chunk k."""
        return [b - a for a, b in zip(self.chunk_at, self.chunk_at[1:])]


async def stream_timed(url: str, prompt: str, blocks: int, size: tuple[int, int], seed: int, fps: int, steps: int | None = None) -> TimedSession:
    """Run one session of `blocks` blocks to the end, timing each media chunk on arrival."""
    from clients.sdk.video import VideoChunk, VideoStart, stream_session

    extra = {"fps": fps} | ({"num_inference_steps": steps} if steps else {})
    timed = TimedSession(started_at=0.0)

    def on_event(client, event) -> None:
        now = time.perf_counter()
        if isinstance(event, VideoStart):
            timed.started_at = now - client.elapsed()  # the client's clock starts when session.start is sent
        elif isinstance(event, VideoChunk) and event.kind == "media":
            timed.chunk_at.append(now)
            timed.chunk_frames.append(event.num_frames)
            if event.serving_overhead is not None:
                timed.overhead_s.append(event.serving_overhead)
            for stage, seconds in (event.serving_stages or {}).items():
                timed.stages_s.setdefault(stage, []).append(seconds)

    result = await stream_session(url, prompt, blocks=blocks, seed=seed, size=f"{size[0]}x{size[1]}", extra=extra,
                                  on_event=on_event, open_timeout=30.0, event_timeout=120.0)
    timed.error = result.failure()
    return timed


def stream_many(url: str, count: int, prompt: str, blocks: int, size: tuple[int, int], fps: int, seed: int = 0) -> list[TimedSession]:
    """`count` sessions at once (seeds seed, seed+1, ...), each to its end."""

    async def all_of_them():
        return await asyncio.gather(*(stream_timed(url, f"{prompt} {i}", blocks, size, seed + i, fps) for i in range(count)))

    return asyncio.run(all_of_them())
