"""Bench 1, serving overhead: the same sessions on the engine in-process and through Serve + WebSocket.

Overhead per chunk, on one clock: the replica stamps each media chunk with the
moment its block's frames were decoded (`frames_ready_at`, Unix seconds) and
the client, on the same host, notes when the fragment arrived; the difference
is everything serving adds (encode, Ray, ingress, WebSocket). `chunk_overhead`
reports it for every media chunk, p50 and p99.

For comparison, each round also runs one session in this process (engine,
then fMP4 encode, inline) beside the same session served; the two alternate so
load drift hits both. `interval_overhead` is the older estimate: the client's
interval between chunks k-1 and k minus the in-process time of block k. It
swings with this machine's load by more than the target it is meant to check.
Time to first chunk: session.start sent -> first media binary on the client,
against open_session + block 0 + its encode in-process.
"""

from __future__ import annotations

import asyncio

from bench import common
from bench.inprocess import PROMPT, load_engine, run_session, session_config
from bench.served import replica_block_seconds, served_app, stream_timed


def add_arguments(parser) -> None:
    parser.add_argument("--rounds", type=int, default=4, help="sessions on each side")
    parser.add_argument("--blocks", type=int, default=12, help="blocks per session")
    parser.add_argument("--size", type=common.parse_size, default=(64, 64), help="WxH")
    parser.add_argument("--fps", type=int, default=16)
    parser.add_argument("--url", help="use this running server (ws://host:port) instead of starting one")
    parser.add_argument("--ingress", choices=("haproxy", "proxy"), default="haproxy",
                        help="the server it starts: as `make serve` (direct ingress behind HAProxy) or behind Serve's proxy")


def run(args) -> dict:
    threads = common.set_torch_threads(args.torch_threads)
    model = common.model_dir(args.models, "world-model")
    size = args.size
    engine = load_engine(model)
    engine_runs, served_runs, replica_runs = [], [], []

    with served_app(model, threads, url=args.url, ingress=args.ingress) as url:
        def in_process(r: int) -> None:
            engine_runs.append((r, run_session(engine, session_config(size, seed=r), args.blocks, args.fps)))

        def served(r: int) -> None:
            served_runs.append((r, asyncio.run(stream_timed(url, PROMPT, args.blocks, size, r, args.fps))))

        def replica_only(r: int) -> None:
            per_block = replica_block_seconds(PROMPT, args.blocks, size, r)
            if per_block is not None:
                replica_runs.append(per_block)

        common.log("serving: warm-up")
        run_session(engine, session_config(size, seed=999), 2, args.fps)
        asyncio.run(stream_timed(url, PROMPT, 2, size, 999, args.fps))
        common.log(f"serving: {args.rounds} rounds x {args.blocks} blocks, in-process and served, interleaved")
        common.interleaved(args.rounds, in_process, served, replica_only)

    engine_by_round = dict(engine_runs)
    errors = [t.error for _, t in served_runs if t.error]
    interval_overhead, block_s, interval_s, first_overhead = [], [], [], []
    for r, timed in served_runs:
        mine = engine_by_round[r]
        block_s += mine.block_s[1:]
        interval_s += timed.intervals_s
        interval_overhead += [served - engine for served, engine in zip(timed.intervals_s, mine.block_s[1:])]
        if timed.first_chunk_s is not None:
            first_overhead.append(timed.first_chunk_s - mine.first_chunk_s)
    engine_first = [run.first_chunk_s for _, run in engine_runs]
    served_first = [t.first_chunk_s for _, t in served_runs if t.first_chunk_s is not None]

    overhead = common.ms_stats([s for _, timed in served_runs for s in timed.overhead_s])
    stages = {stage: common.ms_stats([s for _, timed in served_runs for s in timed.stages_s.get(stage, [])])
              for stage in ("replica", "to_ingress", "to_client")}
    first = common.ms_stats(first_overhead)
    return {
        "results": {
            "torch_threads": threads,
            "ingress": "given url" if args.url else args.ingress,
            "engine_block": common.ms_stats(block_s),
            "engine_encode": common.ms_stats([e for _, run in engine_runs for e in run.encode_s[1:]]),
            "served_interval": common.ms_stats(interval_s),
            # Whole sessions through a handle, per block (block 0 and open/close included): the engine inside
            # the replica process, without ingress, WebSocket or encode. Empty when --url was given.
            "replica_engine_block": common.ms_stats(replica_runs),
            "engine_block_with_block0": common.ms_stats([sum(run.block_s) / len(run.block_s) for _, run in engine_runs]),
            "chunk_overhead": overhead,
            # chunk_overhead by stage, same stamps: encode (and pacing) on the replica, Ray's hop to the
            # ingress, then the ingress, HAProxy or Serve's proxy, and the socket.
            "chunk_overhead_stages": stages,
            "interval_overhead": common.ms_stats(interval_overhead),
            "engine_first_chunk": common.ms_stats(engine_first),
            "served_first_chunk": common.ms_stats(served_first),
            "first_chunk_overhead": first,
            "served_errors": errors,
        },
        "targets": [
            common.target("serving overhead per chunk, p50", overhead["p50_ms"], 2.0, unit="ms"),
            common.target("serving overhead per chunk, p99", overhead["p99_ms"], 10.0, unit="ms"),
            common.target("time to first chunk overhead, p50", first["p50_ms"], 50.0, unit="ms"),
        ],
    }


if __name__ == "__main__":
    import sys

    raise SystemExit(common.main(sys.modules[__name__]))
