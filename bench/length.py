"""Bench 2, length: block time and memory of one session at block 5 and at block 200.

The KV cache keeps sink + window frames and rotary positions come from a
table keyed by the (bounded) context length, so neither a block's cost nor
the memory should grow with the session's length.

Session A runs alone up to its last stretch. Then fresh sessions B1, B2, ...
open one after another and each runs its first blocks alternating block by
block with A's last ones, so A's blocks just before 200 and the B sessions'
blocks around 5 are timed side by side under the same load. The target's
ratio compares the fastest block of each side (a block is deterministic
work: its fastest run is the one other processes disturbed least, and load
bursts on a shared machine outlast a block); medians are reported beside.
A's own early blocks, timed at its start, give a one-session ratio too.
Memory: this process's RSS (after a GC) and the session's tensor bytes at
block 5 and just before the B sessions open.
"""

from __future__ import annotations

import time

from bench import common
from bench.inprocess import load_engine, session_config


def add_arguments(parser) -> None:
    parser.add_argument("--blocks", type=int, default=200, help="the late block (1-based: the last block of session A)")
    parser.add_argument("--early", type=int, default=5, help="the early block (1-based)")
    parser.add_argument("--window", type=int, default=7, help="early blocks timed per fresh session, around --early")
    parser.add_argument("--fresh", type=int, default=3, help="fresh sessions timed beside A's last blocks")
    parser.add_argument("--size", type=common.parse_size, default=(64, 64), help="WxH")


def _timed_block(engine, session) -> float:
    began = time.perf_counter()
    engine.generate_block(session)
    return time.perf_counter() - began


def _memory(block: int, session) -> dict:
    return {"block": block, "rss_mib": common.rss_mib(), "session_bytes": session.memory_bytes()}


def run(args) -> dict:
    # 1-based block numbers; never block 1, which decodes 9 frames instead of 12.
    first = max(2, args.early - args.window // 2)
    early = range(first, first + args.window)
    per_fresh = early.stop - 1  # blocks each fresh session runs beside A
    alone = args.blocks - args.fresh * per_fresh  # A's blocks before the fresh sessions start
    if alone <= early.stop:
        raise ValueError(f"--blocks {args.blocks} is too short for --early {args.early}, --window {args.window} and --fresh {args.fresh}")
    threads = common.set_torch_threads(args.torch_threads)
    engine = load_engine(common.model_dir(args.models, "world-model"))

    session_a = engine.open_session(session_config(args.size, seed=1))
    a_times: dict[int, float] = {}
    memory: dict[str, dict] = {}
    for number in range(1, alone + 1):
        a_times[number] = _timed_block(engine, session_a)
        if number == args.early:
            memory["early"] = _memory(number, session_a)
        if number % 50 == 0:
            common.log(f"length: block {number}/{args.blocks}")
    memory["late"] = _memory(alone, session_a)

    fresh_times: list[float] = []
    late = range(alone + 1, args.blocks + 1)
    number_a = iter(late)
    for f in range(args.fresh):
        session_b = engine.open_session(session_config(args.size, seed=2 + f))
        for number_b in range(1, per_fresh + 1):
            for side in ("a", "b") if number_b % 2 else ("b", "a"):  # who goes first alternates too
                if side == "a":
                    a_times[next(number_a)] = _timed_block(engine, session_a)
                else:
                    seconds = _timed_block(engine, session_b)
                    if number_b in early:
                        fresh_times.append(seconds)
        session_b.close()
    session_a.close()

    best = {"a_early": min(a_times[n] for n in early), "fresh_early": min(fresh_times), "a_late": min(a_times[n] for n in late)}
    medians = {"a_early": common.median([a_times[n] for n in early]), "fresh_early": common.median(fresh_times),
               "a_late": common.median([a_times[n] for n in late])}
    side_by_side = common.ratio(best["a_late"], best["fresh_early"])
    rss_growth = round(memory["late"]["rss_mib"] - memory["early"]["rss_mib"], 2)
    flat = memory["late"]["session_bytes"] == memory["early"]["session_bytes"]
    return {
        "results": {
            "torch_threads": threads,
            "early_blocks": list(early),
            "late_blocks": [late.start, late.stop - 1],
            "samples": {"fresh_early": len(fresh_times), "a_late": len(late)},
            "best_ms": {k: common.ms(v) for k, v in best.items()},
            "median_ms": {k: common.ms(v) for k, v in medians.items()},
            "late_over_early_side_by_side": side_by_side,
            "late_over_early_side_by_side_medians": common.ratio(medians["a_late"], medians["fresh_early"]),
            "late_over_early_one_session": common.ratio(best["a_late"], best["a_early"]),
            "memory": memory,
            "rss_growth_mib": rss_growth,
            "session_bytes_flat": flat,
        },
        "targets": [
            common.target(f"block ~{args.blocks} / block ~{args.early} time (side by side, best of each)", side_by_side, 1.10),
            # RSS of a Python process moves by allocator noise; a leak of even one block's latents per block
            # would add up to many MiB over 200 blocks.
            common.target(f"RSS growth block {args.early} -> {alone}", rss_growth, 16.0, unit="MiB",
                          note="session tensor bytes " + ("unchanged" if flat else "CHANGED")),
        ],
    }


if __name__ == "__main__":
    import sys

    raise SystemExit(common.main(sys.modules[__name__]))
