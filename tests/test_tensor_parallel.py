"""Tensor parallel on CPU: two gloo ranks give the single-process rollout, with half the KV cache each."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp

from deployments.generation.engine import WorldModelEngine
from deployments.generation.geometry import CheckpointError
from deployments.contract.events import Interaction
from deployments.contract.session_spec import SessionSpec

WORLD = 2
CONFIG = SessionSpec(prompt="a red fox in snow", height=64, width=96, seed=7)
# Before block k: keyboard actions from block 1 on, a hard prompt switch at block 2.
EVENTS = {
    1: [Interaction("k", actions=(("w",), ("w", "l"), ("l",)))],
    2: [Interaction("p", prompt="a volcano erupting")],
}
BLOCKS = 3


def rollout(engine: WorldModelEngine) -> dict:
    session = engine.open_session(CONFIG)
    blocks = []
    for k in range(BLOCKS):
        for event in EVENTS.get(k, []):
            session.submit(event)
        blocks.append(engine.generate_block(session))
    kv_shape = tuple(session.kv.k.shape)
    session.close()
    return {
        "latents": [b.latents for b in blocks],
        "frames": [b.frames for b in blocks],
        "metadata": [b.metadata.to_dict() for b in blocks],
        "kv_shape": kv_shape,
    }


def _init(rank: int, store: str):
    from deployments.generation.tensor_parallel import TensorParallel

    torch.set_num_threads(1)  # two ranks share the machine's cores
    return TensorParallel.initialize(rank, WORLD, f"file://{store}", timeout=timedelta(seconds=120))


def _rollout_rank(rank: int, store: str, model_dir: str, out_dir: str) -> None:
    import torch.distributed as dist

    tp = _init(rank, store)
    try:
        engine = WorldModelEngine.from_pretrained(model_dir, tensor_parallel=tp)
        result = rollout(engine)
        result["layout_heads"] = engine.kv_layout(CONFIG.height, CONFIG.width).heads
        result["cancelled"] = _cancel_on_rank_0_only(engine, rank)
        torch.save(result, Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def _cancel_on_rank_0_only(engine: WorldModelEngine, rank: int) -> bool:
    """A cancel seen by one rank must stop every rank at the same step, not leave the others in a collective."""
    from deployments.generation.engine import SessionCancelled

    session = engine.open_session(CONFIG)
    engine.generate_block(session)
    if rank == 0:
        session.cancel()
    try:
        engine.generate_block(session)
    except SessionCancelled:
        return session.cancelled
    finally:
        session.close()
    return False


def _rmsnorm_rank(rank: int, store: str, out_dir: str) -> None:
    import torch.distributed as dist

    from deployments.generation.tensor_parallel import HeadShardedRMSNorm

    tp = _init(rank, store)
    try:
        g = torch.Generator().manual_seed(3)
        full = torch.nn.RMSNorm(24, eps=1e-6)
        with torch.no_grad():
            full.weight.copy_(torch.randn(24, generator=g))
        x = torch.randn(2, 5, 24, generator=g) * 3.0
        sharded = HeadShardedRMSNorm(full, tp)
        local = x[..., rank * 12 : (rank + 1) * 12]
        with torch.no_grad():
            torch.save({"out": sharded(local), "x": x, "weight": full.weight.detach()}, Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def spawn(fn, tmp_path: Path, *args) -> list[dict]:
    out = tmp_path / f"out-{fn.__name__}"
    out.mkdir()
    store = tmp_path / f"store-{fn.__name__}"  # a FileStore file must not outlive its group into another
    mp.spawn(fn, args=(str(store), *args, str(out)), nprocs=WORLD, join=True)
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]


@pytest.mark.timeout(180)
def test_head_sharded_rmsnorm_equals_the_norm_over_all_heads(tmp_path):
    ranks = spawn(_rmsnorm_rank, tmp_path)
    x, weight = ranks[0]["x"], ranks[0]["weight"]
    full = torch.nn.RMSNorm(24, eps=1e-6)
    with torch.no_grad():
        full.weight.copy_(weight)
        expected = full(x)
        # A per-rank norm (what the stock module would do on a slice) is measurably wrong.
        per_rank = torch.cat([torch.nn.functional.rms_norm(x[..., s], (12,), weight[s], 1e-6) for s in (slice(0, 12), slice(12, 24))], -1)
    got = torch.cat([r["out"] for r in ranks], dim=-1)
    assert (got - expected).abs().max().item() <= 1e-6
    assert (per_rank - expected).abs().max().item() > 1e-3


@pytest.mark.timeout(180)
def test_two_ranks_roll_out_what_one_process_does(world_model_dir, engine, tmp_path):
    ranks = spawn(_rollout_rank, tmp_path, str(world_model_dir))
    single = rollout(engine)
    heads = engine.transformer.config.num_attention_heads

    # Each rank's cache holds its half of the heads.
    assert single["kv_shape"][2] == heads
    for r in ranks:
        assert r["layout_heads"] == heads // WORLD
        assert r["kv_shape"] == single["kv_shape"][:2] + (heads // WORLD,) + single["kv_shape"][3:]
        assert r["metadata"] == single["metadata"]
        assert r["cancelled"]

    # Rank 0 decodes; the others skip the VAE but denoise the same latents.
    assert all(f is None for f in ranks[1]["frames"])
    for k in range(BLOCKS):
        lat_diff = (ranks[0]["latents"][k] - single["latents"][k]).abs().max().item()
        assert lat_diff <= 1e-4, f"block {k}: latents differ by {lat_diff}"
        assert torch.equal(ranks[0]["latents"][k], ranks[1]["latents"][k])
        frames_tp, frames_1 = ranks[0]["frames"][k], single["frames"][k]
        assert frames_tp.shape == frames_1.shape and frames_tp.dtype == np.uint8
        frame_diff = np.abs(frames_tp.astype(np.int16) - frames_1.astype(np.int16)).max()
        assert frame_diff <= 1, f"block {k}: frames differ by {frame_diff}"
    # The interactions did something (the comparison is not between two unconditioned runs).
    assert single["metadata"][2]["started_event_ids"] == ["p"]


def test_heads_that_do_not_split_are_refused_before_loading(world_model_dir):
    three_ranks = SimpleNamespace(world_size=3, device_type="cpu")  # the tiny model has 2 heads
    with pytest.raises(CheckpointError, match="num_attention_heads=2"):
        WorldModelEngine.from_pretrained(world_model_dir, tensor_parallel=three_ranks)
