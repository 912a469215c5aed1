"""The WorldModel replica: the engine, its session slots and mailbox, warm-up, and one stream per session.

Each session is one streaming call (`run_session`). Its first item says whether
the replica took it and carries the replica's mailbox, through which every
later control message arrives; the block loop itself is the scheduler's
(scheduler.py).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import AsyncIterator

import ray

from deployments.config import AppConfig
from deployments.contract.session_spec import SessionSpec
from deployments.observability.metrics import ReplicaMetrics
from deployments.sessions.slots import SessionSlots
from deployments.world_model.flow import FlowSettings
from deployments.world_model.messages import SessionAccepted, SessionRefused
from deployments.world_model.scheduler import PIPELINE_DEPTH, Scheduler, SchedulerSettings

logger = logging.getLogger("ray.serve")


class WorldModelServer:
    def __init__(self, config: AppConfig) -> None:
        import torch
        from ray import serve

        from deployments.models.ensure import ensure_tiny_models
        from deployments.models.locate import locate_model
        from deployments.sessions.mailbox import MailboxActor
        from deployments.world_model.engine_host import EngineLoad, make_engine_host

        if config.torch_threads:
            torch.set_num_threads(config.torch_threads)

        self.config = config
        path = ensure_tiny_models(config.model_path) if config.build_tiny_models else locate_model(config.model)
        load = EngineLoad(path, config.accelerator, config.dtype, config.vae_dtype or config.dtype, config.video_decoder,
                          config.compile_transformer)
        self.host = make_engine_host(load, config.tensor_parallel_size)
        self.host.start()
        self.capacity, self.footprint = self.host.capacity(
            config.height, config.width, config.max_sessions_per_replica, config.gpu_memory_fraction
        )
        # Sessions' blocks are denoised together and their frames decoded together. On a GPU the decode
        # runs beside the next blocks' denoising (its own CUDA stream); on a CPU with small models two
        # threads mostly wait for each other's Python, so the decode stays inside the block (measured:
        # bench/serving.py, bench/pipelining.py).
        overlap = config.decode_beside_next_block
        self.overlap_decode = self.host.info()["device"].startswith("cuda") if overlap is None else overlap
        self.mailbox = MailboxActor.remote()
        try:
            self.replica_id = serve.get_replica_context().replica_id.unique_id
        except Exception:  # outside Serve (tests of the class itself)
            self.replica_id = "local"
        self.metrics = ReplicaMetrics("video")
        self.slots = SessionSlots(self.capacity, on_change=self.metrics.slots)
        flow = FlowSettings(config.max_media_ahead_s, config.client_stalled_timeout_s)
        self.scheduler = Scheduler(self.host, self.mailbox, self.metrics, SchedulerSettings(
            config.max_batch_sessions, self.overlap_decode, config.max_session_seconds, flow,
            mailbox_poll_s=min(1.0, config.lease_timeout_s / 4)))
        self.warm_up: dict = {"blocks": 0, "seconds": None, "error": None}
        self._warming: asyncio.Future | None = None
        try:
            asyncio.get_running_loop()
            self._warmed()  # Serve builds replicas on their event loop: start at once, answer readiness after
        except RuntimeError:  # built outside an event loop (tests of the class): the first call starts it
            pass
        logger.info("world model %s loaded: %d session slots, %.1f MiB per session", path, self.capacity, self.footprint.total / 2**20)

    # -- warm-up -----------------------------------------------------------------
    def _warmed(self) -> asyncio.Future:
        if self._warming is None:
            self._warming = asyncio.ensure_future(self._warm_up())
        return asyncio.shield(self._warming)

    async def _warm_up(self) -> None:
        """Throwaway sessions through every step a real one takes (block 0 and steady blocks denoised,
        decoded, encoded), outside the slots and the session metrics. A compiled engine's warm-up runs one
        session through every context length, then (where sessions share forwards) two together: after
        that no session shape compiles anything. A failure is logged, never fatal: the first real session
        then pays for the setup, as it would without a warm-up."""
        blocks = self.config.warmup_blocks
        if blocks == 0:
            return
        info = self.host.info()
        groups = [1]
        if info["compiled"]:
            blocks = max(blocks, info["warm_up_blocks"])
            if min(self.capacity, self.config.max_batch_sessions) > 1:
                groups.append(2)  # a batch's first forward compiles once, for every batch size after it
        began = time.perf_counter()
        try:
            for sessions in groups:
                await self._warm_up_group(sessions, blocks, info["image_conditioned"])
        except Exception as exc:  # noqa: BLE001 - reported in stats and the log, the replica serves on
            self.warm_up["error"] = f"{type(exc).__name__}: {exc}"
            logger.warning("world model warm-up failed after %d blocks: %s", self.warm_up["blocks"], self.warm_up["error"])
        finally:
            self.warm_up["seconds"] = round(time.perf_counter() - began, 3)
        logger.info("world model warmed up: %d blocks in %.2f s", self.warm_up["blocks"], self.warm_up["seconds"])

    async def _warm_up_group(self, sessions: int, blocks: int, image_conditioned: bool) -> None:
        """`sessions` throwaway sessions run `blocks` blocks together, each block decoded and encoded."""
        import numpy as np

        from deployments.media.fmp4 import AsyncFragmentEncoder

        height, width = self.config.height, self.config.width
        image = np.full((height, width, 3), 128, np.uint8) if image_conditioned else None
        specs = [SessionSpec(prompt="warm-up", height=height, width=width, fps=self.config.fps, seed=seed, image=image,
                             num_inference_steps=self.config.num_inference_steps) for seed in range(sessions)]
        sids = ["warm-up-" + spec.session_id for spec in specs]
        encoder = AsyncFragmentEncoder(width, height, self.config.fps)
        opened: list[str] = []
        try:
            for spec, sid in zip(specs, sids):
                await self.host.open(spec, sid)
                opened.append(sid)
            for _ in range(blocks):
                made = _raised(await self.host.generate_many(sids, decode=not self.overlap_decode))
                frames = _raised(await self.host.decode_many(sids)) if self.overlap_decode else {sid: made[sid].frames for sid in sids}
                await encoder.encode(frames[sids[0]])
                self.warm_up["blocks"] += 1
            await encoder.close()
        finally:
            for sid in opened:
                await self.host.close(sid)
            encoder.shutdown()

    # -- Serve hooks ---------------------------------------------------------
    def record_routing_stats(self) -> dict:
        return self.slots.routing_stats()

    def record_autoscaling_stats(self) -> dict:
        return self.slots.autoscaling_stats()

    async def model_info(self) -> dict:
        """What the ingress needs to validate a session.start for this model; answered once the replica has
        warmed up, so readiness (`/healthz`, a session waiting for its model) means a warm replica."""
        await self._warmed()
        return {**self.host.info(), "pipeline_depth": PIPELINE_DEPTH, "tensor_parallel_size": self.config.tensor_parallel_size}

    async def check_health(self) -> None:
        await self.host.check()

    async def stats(self) -> dict:
        """For tests and operators: what this replica holds right now."""
        return {
            "replica_id": self.replica_id,
            "pid": os.getpid(),
            "capacity": self.capacity,
            "sessions": self.slots.held,
            "mailbox_sessions": await self.mailbox.sessions.remote(),
            "footprint_bytes": self.footprint.total,
            "node_id": ray.get_runtime_context().get_node_id(),
            "ranks": await self.host.ranks(),
            "batching": self.scheduler.stats(),
            "warm_up": dict(self.warm_up),
        }

    async def rollout_latents(self, request: SessionSpec, blocks: int) -> list:
        """Each block's clean latents for a session's first `blocks` blocks, through this replica's engine
        (every rank): for exactness checks between deployments (TP=2 against TP=1) and benchmarks."""
        await self._warmed()
        if not self.slots.try_take(request.session_id):
            raise RuntimeError("no free session slot on this replica")
        try:
            await self.host.open(request, request.session_id)
            try:
                return [(await self.scheduler.blocks.submit(request.session_id)).latents for _ in range(blocks)]
            finally:
                await self.host.close(request.session_id)
        finally:
            self.slots.release(request.session_id)

    # -- one session -----------------------------------------------------------
    async def run_session(self, request: SessionSpec) -> AsyncIterator[object]:
        sid = request.session_id
        await self._warmed()  # a replica Serve routes to before its warm-up ended (a new one, scaling up)
        if not self.slots.try_take(sid):
            # Refuse at once so the ingress can try another replica; never queue a session.
            self.metrics.session_start("over_capacity")
            yield SessionRefused("over_capacity", "no free session slot on this replica", self.config.retry_after_s)
            return
        run = self.scheduler.new_run(request)
        opened = False
        try:
            await self.mailbox.open.remote(sid, self.config.lease_timeout_s)
            try:
                opened = True  # from the call on: a cancelled open is closed once it has run (EngineHost.close)
                seed = await self.host.open(request, sid)
            except ValueError as exc:
                self.metrics.session_start("invalid_request")
                yield SessionRefused("invalid_request", str(exc))
                return
            self.metrics.session_start("accepted")
            yield SessionAccepted(sid, self.replica_id, seed, self.mailbox)
            for failure in await self.scheduler.apply(sid, request.interactions):
                yield failure
            async for message in self.scheduler.run(run):
                yield message
        finally:
            await self.scheduler.release(run)
            try:
                if opened:
                    await self.host.close(sid)  # a second cancellation may end this wait, never the close
            finally:
                self.slots.release(sid)
                try:
                    self.mailbox.close.remote(sid)
                except Exception:  # the replica is going down; the mailbox goes with it
                    pass


def _raised(outcomes: dict) -> dict:
    """Per-session outcomes of a host call, raising the first failure among them."""
    for outcome in outcomes.values():
        if isinstance(outcome, BaseException):
            raise outcome
    return outcomes
