"""Bench: the built-in world model's behaviour (keys, prompts, fidelity, long rollouts) and its block time.

The behaviour reports are the ones `tests/test_builtin_world_model.py` asserts
on (deployments/training/behaviour.py), printed in full. Block time: the
trained model and a random-weight model of the tiny random architecture (what
the server shipped before) at the default size, interleaved, one thread;
real time at 16 fps is 0.75 s per 12-frame block.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from bench import common

REALTIME_BLOCK_S = 12 / 16


def add_arguments(parser) -> None:
    parser.add_argument("--blocks", type=int, default=8, help="blocks per timed session")
    parser.add_argument("--long", type=int, default=200, help="blocks of the long rollout")
    parser.add_argument("--rounds", type=int, default=2, help="timed sessions per model")


def _block_times(engine, blocks: int, seed: int) -> list[float]:
    from deployments.training.behaviour import held

    from deployments.contract.session_spec import SessionSpec

    session = engine.open_session(SessionSpec(prompt="a green meadow", height=64, width=64, seed=seed))
    times = []
    for events in held(("w",), blocks):
        for e in events:
            session.submit(e)
        began = time.perf_counter()
        engine.generate_block(session)
        times.append(time.perf_counter() - began)
    session.close()
    return times[1:]  # block 0 decodes 9 frames


def run(args) -> dict:
    from deployments.generation.engine import WorldModelEngine
    from deployments.models.builtin_world_model import BUILTIN_SPEC, install_builtin_world_models
    from deployments.models.tiny_world_model import WorldModelSpec, build_world_model
    from deployments.training import behaviour

    threads = common.set_torch_threads(args.torch_threads)
    tmp = Path(tempfile.mkdtemp(prefix="world-bench-"))
    dirs = install_builtin_world_models(tmp / "builtin")
    t2v = WorldModelEngine.from_pretrained(dirs["world-model"])
    i2v = WorldModelEngine.from_pretrained(dirs["world-model-i2v"])
    build_world_model(tmp / "random-builtin", replace(BUILTIN_SPEC, image_conditioned=True), seed=0)
    random_i2v = WorldModelEngine.from_pretrained(tmp / "random-builtin")
    build_world_model(tmp / "random-tiny", WorldModelSpec(), seed=0)
    tiny = WorldModelEngine.from_pretrained(tmp / "random-tiny")

    still = behaviour.pan_report(t2v, None)
    pans = {k: behaviour.pan_report(t2v, k) for k in "adjlikws"}
    agreement = {
        k: behaviour.sign_agreement(pans[k]["dx"], s) for k, s in (("a", 1), ("j", 1), ("d", -1), ("l", -1))
    } | {k: behaviour.sign_agreement(pans[k]["dy"], s) for k, s in (("i", 1), ("k", -1))} | {
        "w": behaviour.sign_agreement([z - 1 for z in pans["w"]["zoom"]], 1),
        "s": behaviour.sign_agreement([z - 1 for z in pans["s"]["zoom"]], -1),
    }
    script = behaviour.held(("w",), 2) + behaviour.held(("l",), 2, first=2)
    fidelity = behaviour.fidelity_report(i2v, "a city plaza", script)
    fidelity_random = behaviour.fidelity_report(random_i2v, "a city plaza", script)
    text_fidelity = {p: behaviour.fidelity_report(t2v, p, script, from_image=False) for p in ("a city plaza", "a snowy field", "a green meadow")}
    prompts = ["a snowy field", "a lava field", "a green meadow", "a sandy desert", "a dense forest", "a city plaza", "an ocean shore"]
    colours = behaviour.colour_report(t2v, prompts)
    transition = behaviour.transition_report(t2v, "a green meadow", "a snowy field", transition=4)
    long = behaviour.coherence_report(t2v, blocks=args.long)

    trained_times, tiny_times = [], []
    common.interleaved(args.rounds, lambda r: trained_times.extend(_block_times(t2v, args.blocks, r)),
                       lambda r: tiny_times.extend(_block_times(tiny, args.blocks, r)))
    trained_block = common.median(trained_times)
    return {
        "machine": common.machine(),
        "torch_threads": threads,
        "targets": [
            *[common.target(f"key {k}: blocks moving the right way", v, 0.8, at_most=False) for k, v in agreement.items()],
            common.target("image-to-video PSNR vs renderer, first 2 blocks (dB)", min(fidelity["psnr_db"][:2]), 18.0, at_most=False, unit="dB"),
            common.target("text-to-video first block: sharpness as a share of the renderer's",
                          min(f["sharpness"][0] for f in text_fidelity.values()), 0.5, at_most=False),
            common.target("long rollout: lowest neighbour correlation", min(long["neighbour_correlation"]), 0.8, at_most=False),
            common.target("block time at 64x64, trained model (s)", trained_block, REALTIME_BLOCK_S, unit="s", note="real time at 16 fps"),
        ],
        "still_dx": still["dx"],
        "pans": pans,
        "fidelity": fidelity,
        "fidelity_random_weights": fidelity_random,
        "text_to_video_fidelity": text_fidelity,
        "colours": colours,
        "renderer_colours": {p: behaviour.renderer_colour(p).tolist() for p in prompts},
        "transition": transition,
        "long_rollout": long,
        "block_time": {"trained": common.ms_stats(trained_times), "random_tiny": common.ms_stats(tiny_times),
                       "realtime_factor": round(REALTIME_BLOCK_S / trained_block, 2) if trained_block else None},
        "mean_abs_dx": {k: float(np.mean(np.abs(p["dx"]))) for k, p in pans.items()} | {"none": float(np.mean(np.abs(still["dx"])))},
    }


if __name__ == "__main__":
    import sys

    sys.exit(common.main(sys.modules[__name__]))
