"""Rendered trajectories on disk: one `.npz` per trajectory, made once, read by every training stage.

Trajectory i is rendered from seed (seed, i), so a data set is the same
whatever the number of worker processes, and an interrupted render resumes
where it stopped.
"""

from __future__ import annotations

import json
import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from deployments.generation.camera import Pose


@dataclass
class StoredTrajectory:
    frames: np.ndarray  # uint8 (T, H, W, 3)
    prompt_mixes: list[tuple[tuple[str, float], ...]]
    relative_poses: list[tuple[Pose, ...]]


def trajectory_seed(seed: int, index: int) -> int:
    return int(np.random.SeedSequence([seed, index]).generate_state(1)[0])


def _render_one(args: tuple[Path, int, int, int, int, int, bool]) -> str:
    path, seed, index, blocks, height, width, anywhere = args
    if path.is_file():
        return str(path)
    from deployments.training.trajectories import render_trajectory

    traj = render_trajectory(trajectory_seed(seed, index), blocks, height, width, anywhere=anywhere)
    meta = {
        "prompt_mixes": [list(map(list, mix)) for mix in traj.prompt_mixes],
        "relative_poses": [[[list(p.translation), list(p.rotation)] for p in block] for block in traj.relative_poses],
    }
    tmp = path.with_name(path.stem + ".tmp.npz")
    np.savez(tmp, frames=traj.frames, meta=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8))
    os.replace(tmp, path)
    return str(path)


def render_dataset(out_dir: str | os.PathLike, count: int, blocks: int, *, seed: int, height: int = 64, width: int = 64, workers: int = 1, start: int = 0) -> list[Path]:
    """Trajectories `start` .. `start + count - 1`: the first half of the set starts at the world's
    origin (so a text-to-video session opens on a familiar view), the second half anywhere."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    jobs = [(out / f"traj_{i:05d}.npz", seed, i, blocks, height, width, not starts_at_origin(i, start + count))
            for i in range(start, start + count)]
    if workers <= 1:
        return [Path(_render_one(job)) for job in jobs]
    with ProcessPoolExecutor(workers) as pool:
        return [Path(p) for p in pool.map(_render_one, jobs, chunksize=4)]


def starts_at_origin(index: int, total: int) -> bool:
    """Whether trajectory `index` of a set of `total` starts at the world's origin (the first half do)."""
    return index < total // 2


def load_trajectory(path: str | os.PathLike) -> StoredTrajectory:
    with np.load(path) as data:
        frames = data["frames"]
        meta = json.loads(data["meta"].tobytes().decode())
    mixes = [tuple((str(p), float(w)) for p, w in mix) for mix in meta["prompt_mixes"]]
    poses = [tuple(Pose(tuple(t), tuple(r)) for t, r in block) for block in meta["relative_poses"]]
    return StoredTrajectory(frames, mixes, poses)


def list_trajectories(data_dir: str | os.PathLike) -> list[Path]:
    return sorted(p for p in Path(data_dir).glob("traj_*.npz") if not p.name.endswith(".tmp.npz"))
