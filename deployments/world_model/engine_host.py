"""Where a WorldModel replica's engine runs: in its own process, or sharded over rank workers.

`EngineHost` is the one async protocol the replica's block loop speaks, by
session id; an executor runs each of its calls by method name on the engine's
`EngineSessions`:

- `LocalExecutor`: tensor_parallel_size 1; the engine lives in the replica.
- `TensorParallelExecutor`: one `RankWorker` actor per rank, each in its own
  GPU bundle of the replica's placement group (bundle 0 is the replica's). The
  ranks form a torch.distributed group (NCCL on GPUs, gloo on CPU), each holds
  1/N of the transformer and of every session's KV cache, and every call goes
  to all of them so they run each block in lockstep; rank 0's answer (its
  frames) is the call's. A rank that dies takes the replica down with it (the
  replica's sessions then see `replica_lost` and Serve starts a new replica).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import secrets
import socket
from pathlib import Path

import ray

from deployments.contract.events import Interaction
from deployments.contract.session_spec import SessionSpec
from deployments.generation.session import GeneratedBlock

logger = logging.getLogger("ray.serve")


def _device(accelerator: str) -> str:
    import torch

    return "cuda" if torch.cuda.is_available() and accelerator != "cpu" else "cpu"


@dataclasses.dataclass(frozen=True)
class EngineLoad:
    """How every rank loads the replica's engine (plain values: it travels to the rank actors)."""

    path: Path
    accelerator: str
    dtype: str  # torch dtype names
    vae_dtype: str
    video_decoder: str = "vae"
    compile_blocks: bool = False

    def engine(self, tensor_parallel=None):
        import torch

        from deployments.generation.engine import WorldModelEngine

        return WorldModelEngine.from_pretrained(self.path, device=_device(self.accelerator), dtype=getattr(torch, self.dtype),
                                                vae_dtype=getattr(torch, self.vae_dtype), tensor_parallel=tensor_parallel,
                                                video_decoder=self.video_decoder, compile_blocks=self.compile_blocks)


class EngineSessions:
    """One engine and the sessions open on it, by id (what each host, and each rank, keeps)."""

    def __init__(self, load: EngineLoad, tensor_parallel=None) -> None:
        self.engine = load.engine(tensor_parallel)
        self.sessions: dict = {}

    def info(self) -> dict:
        g = self.engine.geometry
        return {
            "frames_per_block": g.num_frames_per_block,
            "temporal_factor": g.scale_factor_temporal,
            "size_multiple": g.size_multiple,
            "image_conditioned": self.engine.image_conditioned,
            "accepts_camera": self.engine.accepts_camera,
            "device": str(self.engine.device),
            "compiled": self.engine.compiled,
            "warm_up_blocks": self.engine.warm_up_blocks,
        }

    def capacity(self, height: int, width: int, cap: int | None, gpu_memory_fraction: float):
        """(session slots, footprint) on this engine's device: its memory budget over one session's state."""
        from deployments.world_model.capacity import measure_footprint, session_slots

        footprint = measure_footprint(self.engine, height, width)
        return session_slots(footprint, cap, gpu_memory_fraction, self.engine.device), footprint

    def open(self, config: SessionSpec, session_id: str) -> int:
        self.sessions[session_id] = self.engine.open_session(config, session_id)
        return self.sessions[session_id].seed

    def submit(self, session_id: str, interaction: Interaction) -> None:
        self.sessions[session_id].submit(interaction)

    def generate_many(self, session_ids: list[str], decode: bool = True) -> dict[str, GeneratedBlock | BaseException]:
        """The next block of each session; sessions whose shapes allow it are denoised together.

        A session cancelled half-way maps to its SessionCancelled; other failures raise for the whole call.
        With `decode=False` the frames come from `decode_many`, outside the engine lock.
        """
        groups: dict[tuple, list[str]] = {}
        for sid in session_ids:
            groups.setdefault(self.engine.batch_key(self.sessions[sid]), []).append(sid)
        outcomes: dict[str, GeneratedBlock | BaseException] = {}
        for ids in groups.values():
            outcomes.update(zip(ids, self.engine.generate_blocks([self.sessions[sid] for sid in ids], decode)))
        return outcomes

    def decode_many(self, session_ids: list[str]) -> dict[str, object]:
        """Frames of each session's oldest deferred block; sessions at the same point decode as one batch."""
        frames = self.engine.decode_grouped([self.sessions[sid] for sid in session_ids])
        return {sid: frames[i] for i, sid in enumerate(session_ids)}

    def cancel(self, session_id: str) -> None:
        session = self.sessions.get(session_id)
        if session is not None:
            session.cancel()

    def close(self, session_id: str) -> None:
        session = self.sessions.pop(session_id, None)
        if session is not None:
            session.close()

    def holding(self) -> dict:
        """What the engine keeps for open sessions (KV cache, text condition, VAE state): leaks show here."""
        return {"engine_sessions": len(self.sessions), "session_bytes": sum(s.memory_bytes() for s in self.sessions.values())}


class LocalExecutor:
    """tensor_parallel_size 1: the engine lives in the replica; each call runs on a worker thread."""

    def __init__(self, load: EngineLoad) -> None:
        self.local = EngineSessions(load)

    def start(self) -> list:
        return [self.local.info()]

    def gather(self, method: str, *args) -> list:
        """Blocking, on every rank: their answers (used at start, before the event loop serves)."""
        return [getattr(self.local, method)(*args)]

    async def call(self, method: str, *args):
        return await asyncio.to_thread(getattr(self.local, method), *args)

    call_rank0 = call

    def signal(self, method: str, *args) -> None:
        getattr(self.local, method)(*args)

    async def describe(self) -> list[dict]:
        return [_describe(0, self.local)]


@ray.remote(max_concurrency=4)  # `cancel` must get in while `generate_many` runs
class RankWorker:
    """One rank of a tensor-parallel replica: its share of the engine, run by method name."""

    def __init__(self, rank: int, world_size: int, init_method: str, load: EngineLoad) -> None:
        import torch

        from deployments.generation.tensor_parallel import TensorParallel

        device = _device(load.accelerator)
        if device == "cuda":
            torch.cuda.set_device(0)  # Ray gives each rank exactly its own GPU
        tp = TensorParallel.initialize(rank, world_size, init_method, device_type=device)
        self.rank = rank
        self.local = EngineSessions(load, tensor_parallel=tp)

    def run(self, method: str, *args, answer: bool = True):
        result = getattr(self.local, method)(*args)
        # The ranks run every call in lockstep; rank 0's answer is the call's (only it decodes frames), the
        # others' would only cross the object store.
        return result if answer or self.rank == 0 else None

    def describe(self) -> dict:
        return _describe(self.rank, self.local)


class TensorParallelExecutor:
    """One `RankWorker` per rank, each in its own bundle of the replica's placement group (bundle 0 is
    the replica's); every call goes to all of them so they run it in lockstep."""

    def __init__(self, load: EngineLoad, world_size: int) -> None:
        from ray.util.placement_group import get_current_placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        group = get_current_placement_group()
        if group is None:
            raise RuntimeError("tensor_parallel_size > 1 needs the replica's placement group (one GPU bundle per rank)")
        init_method = f"tcp://{ray.util.get_node_ip_address()}:{_free_port()}"
        bundles = group.bundle_specs
        if len(bundles) != world_size + 1:
            raise RuntimeError(f"the replica's placement group has {len(bundles)} bundles, expected 1 + {world_size} ranks")
        self.workers = [
            RankWorker.options(
                # Each rank takes exactly what its bundle holds: a GPU on GPU clusters.
                num_cpus=bundles[rank + 1].get("CPU", 0),
                num_gpus=bundles[rank + 1].get("GPU", 0),
                scheduling_strategy=PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=rank + 1),
            ).remote(rank, world_size, init_method, load)
            for rank in range(world_size)
        ]

    def start(self) -> list:
        # The ranks meet in init_process_group inside their constructors: wait for all of them.
        return self.gather("info")

    def gather(self, method: str, *args) -> list:
        return ray.get([w.run.remote(method, *args) for w in self.workers])

    async def call(self, method: str, *args):
        try:
            return (await asyncio.gather(*(w.run.remote(method, *args, answer=False) for w in self.workers)))[0]
        except ray.exceptions.RayActorError:
            _rank_lost()

    async def call_rank0(self, method: str, *args):
        """Work only rank 0 has (the VAE's); its actor takes it beside a running collective call."""
        try:
            return await self.workers[0].run.remote(method, *args)
        except ray.exceptions.RayActorError:
            _rank_lost()

    def signal(self, method: str, *args) -> None:
        for worker in self.workers:
            worker.run.remote(method, *args)

    async def describe(self) -> list[dict]:
        try:
            return await asyncio.gather(*(w.describe.remote() for w in self.workers))
        except ray.exceptions.RayActorError:
            _rank_lost()


def _rank_lost():
    # A rank is gone: its peers would wait in a collective forever. Take the replica down (the ranks go
    # with it) so Serve starts a fresh one and the sessions hear replica_lost.
    logger.error("a tensor-parallel rank died; stopping this replica")
    os._exit(1)


def _describe(rank: int, local: EngineSessions) -> dict:
    return {"rank": rank, "pid": os.getpid(), "node_id": ray.get_runtime_context().get_node_id(), "gpu_ids": ray.get_gpu_ids(),
            "compiled_graphs": local.engine.compiled_graphs, **local.holding()}


class EngineHost:
    """The replica's engine by session id, whatever executor runs it: one async protocol for the block loop."""

    def __init__(self, executor: LocalExecutor | TensorParallelExecutor) -> None:
        self.executor = executor
        self._info: dict | None = None
        self._opening: dict[str, asyncio.Future] = {}  # opens whose caller may be cancelled before they end

    def start(self) -> None:
        self._info = self.executor.start()[0]

    def info(self) -> dict:
        return self._info

    def capacity(self, height: int, width: int, cap: int | None, gpu_memory_fraction: float):
        """Each rank measures its own device (it holds 1/N of every KV cache); the tightest rank decides."""
        return min(self.executor.gather("capacity", height, width, cap, gpu_memory_fraction), key=lambda answer: answer[0])

    async def open(self, config: SessionSpec, session_id: str) -> int:
        if config.seed is None:
            # Every rank must draw the same noise: the seed is settled here, once, not on each rank.
            config = dataclasses.replace(config, seed=secrets.randbits(63))
        # The open runs to its end even when its caller is cancelled (it is in a worker thread or on the ranks
        # anyway); `close` waits for it, so a session cancelled while opening leaves nothing behind.
        opening = self._opening[session_id] = asyncio.ensure_future(self.executor.call("open", config, session_id))
        try:
            return await asyncio.shield(opening)
        except asyncio.CancelledError:
            raise  # the caller is gone, the open goes on: `close` waits for it
        except BaseException:
            self._opening.pop(session_id, None)  # refused: nothing was opened
            raise

    async def submit(self, session_id: str, interaction: Interaction) -> None:
        # The engine refuses the same interactions on every rank; rank 0's refusal is raised.
        await self.executor.call("submit", session_id, interaction)

    async def generate_many(self, session_ids: list[str], decode: bool = True) -> dict[str, GeneratedBlock | BaseException]:
        return await self.executor.call("generate_many", session_ids, decode)

    async def decode_many(self, session_ids: list[str]) -> dict[str, object]:
        return await self.executor.call_rank0("decode_many", session_ids)

    def cancel(self, session_id: str) -> None:
        self.executor.signal("cancel", session_id)

    async def close(self, session_id: str) -> None:
        # Called from `finally` blocks of cancelled sessions, where a second cancellation can end the wait:
        # shielded, the close still runs (a call still queued for a worker thread would otherwise be dropped).
        await asyncio.shield(self._close(session_id))

    async def _close(self, session_id: str) -> None:
        opening = self._opening.pop(session_id, None)
        if opening is not None:
            await asyncio.wait([opening])  # closing before the open has run would leave what it opens
            if not opening.cancelled():
                opening.exception()  # seen here: a failed open whose caller was cancelled
        await self.executor.call("close", session_id)

    async def ranks(self) -> list[dict]:
        return await self.executor.describe()

    async def check(self) -> None:
        await asyncio.wait_for(self.executor.describe(), timeout=30)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def make_engine_host(load: EngineLoad, tensor_parallel_size: int) -> EngineHost:
    if tensor_parallel_size == 1:
        return EngineHost(LocalExecutor(load))
    return EngineHost(TensorParallelExecutor(load, tensor_parallel_size))
