"""Bench 4, batching: K sessions at once on one WorldModel replica (K = 1, 2, 4, 8).

Each K opens K WebSocket sessions together against a single replica (with
`max_sessions_per_replica` 8) and runs each to its end. Aggregate frames per
second = frames of every media chunk / (last chunk's arrival - first
session.start); per-session interval = the median gap between one session's
consecutive chunks. Ks run in rounds (1, 2, 4, 8, 1, 2, ...) so load drift
hits every K alike. The engine today serializes forwards behind one lock, so
K sessions share one block's worth of compute at a time; the target asks
that sessions whose shapes allow it be denoised together in one forward.
"""

from __future__ import annotations

from bench import common
from bench.served import served_app, stream_many

PROMPT = "a harbour at night, session"


def add_arguments(parser) -> None:
    parser.add_argument("--ks", type=lambda t: [int(k) for k in t.split(",")], default=[1, 2, 4, 8], help="comma-separated")
    parser.add_argument("--blocks", type=int, default=8, help="blocks per session")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--size", type=common.parse_size, default=(64, 64), help="WxH")
    parser.add_argument("--fps", type=int, default=16)
    parser.add_argument("--url", help="use this running server (ws://host:port, one replica, >= max K slots)")


def record(row: dict, sessions) -> None:
    """Add one run of K sessions to its row: aggregate fps, every chunk interval, errors."""
    began = min(s.started_at for s in sessions)
    ended = max(s.chunk_at[-1] for s in sessions if s.chunk_at)
    row["fps"].append(sum(sum(s.chunk_frames) for s in sessions) / (ended - began))
    row["interval_s"] += [x for s in sessions for x in s.intervals_s]
    row["errors"] += [s.error for s in sessions if s.error]


def run(args) -> dict:
    threads = common.set_torch_threads(args.torch_threads)
    model = common.model_dir(args.models, "world-model")
    by_k: dict[int, dict[str, list]] = {k: {"fps": [], "interval_s": [], "errors": []} for k in args.ks}

    with served_app(model, threads, max_sessions=max(args.ks), url=args.url) as url:
        stream_many(url, 1, PROMPT, 2, args.size, args.fps, seed=999)  # warm-up

        common.log(f"batching: K in {args.ks}, {args.rounds} rounds x {args.blocks} blocks")
        for r in range(args.rounds):  # every K once per round, in order: no K sees only the quiet minutes
            for k in args.ks:
                record(by_k[k], stream_many(url, k, PROMPT, args.blocks, args.size, args.fps, seed=100 * r))

    table = {
        str(k): {
            "aggregate_fps": round(common.median(v["fps"]), 2),
            "session_interval": common.ms_stats(v["interval_s"]),
            "errors": v["errors"],
        }
        for k, v in by_k.items()
    }
    if 1 in args.ks:
        alone = table["1"]["session_interval"]["p50_ms"]
        for k, row in table.items():
            row["fps_over_k1"] = common.ratio(row["aggregate_fps"], table["1"]["aggregate_fps"])
            # 1.0: each session waits for the other K - 1 sessions' blocks (one forward at a time);
            # 1/K: K sessions cost one session's time (all denoised together).
            row["interval_over_k_times_k1"] = common.ratio(row["session_interval"]["p50_ms"], int(k) * alone)
    targets = []
    if 1 in args.ks and 4 in args.ks:
        targets.append(common.target("aggregate fps K=4 / K=1", common.ratio(table["4"]["aggregate_fps"], table["1"]["aggregate_fps"]),
                                     2.0, at_most=False))
    return {"results": {"torch_threads": threads, "by_k": table}, "targets": targets}


if __name__ == "__main__":
    import sys

    raise SystemExit(common.main(sys.modules[__name__]))
