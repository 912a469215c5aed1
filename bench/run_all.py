"""Run every benchmark, each in its own process, and print one JSON document (also written to --out).

    python -m bench.run_all                      # the whole suite, bench/results/cpu.json
    python -m bench.run_all --only media,length  # some of it
    python -m bench.run_all --quick              # tiny sizes: checks that everything runs, numbers mean little

A process per benchmark keeps them from disturbing each other (Ray, threads,
memory measured as RSS) and lets one that fails or hangs be recorded as an
error while the rest go on. Each writes its JSON to a file; its stdout and
stderr (Ray logs among them) go to a log file whose last lines a failure record carries.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import common

# name -> (seconds it may take, arguments for --quick)
BENCHES: dict[str, tuple[int, list[str]]] = {
    "serving": (300, ["--rounds", "1", "--blocks", "3"]),
    "length": (240, ["--blocks", "16", "--early", "3", "--window", "3", "--fresh", "2"]),
    "pipelining": (240, ["--size", "64x64", "--blocks", "4", "--rounds", "1", "--steps", "2"]),
    "batching": (300, ["--ks", "1,2", "--blocks", "2", "--rounds", "1"]),
    "decoders": (120, ["--blocks", "2", "--rounds", "1"]),
    "media": (120, ["--encode-sizes", "64x64", "--encode-frames", "12", "--filter-sizes", "128x96", "--filter-frames", "4", "--rounds", "2"]),
    "understanding": (180, ["--frames", "4,8", "--rounds", "1"]),
    "load": (300, ["--gen", "2", "--chat", "2", "--seconds", "8", "--warmup", "3"]),
}
ROOT = Path(__file__).resolve().parents[1]  # the checkout: `python -m bench.NAME` runs from here
DEFAULT_OUT = ROOT / "bench" / "results" / "cpu.json"


def run_bench(name: str, extra: list[str], timeout_s: float, workdir: Path) -> dict:
    """One benchmark in a child process; its JSON, or an error record saying what went wrong."""
    out, log = workdir / f"{name}.json", workdir / f"{name}.log"
    command = [sys.executable, "-m", f"bench.{name}", "--out", str(out), *extra]
    common.log(f"run_all: {name} ({' '.join(extra) or 'defaults'})")
    began = time.perf_counter()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    try:
        with open(log, "w") as sink:
            code = subprocess.run(command, check=False, stdout=sink, stderr=subprocess.STDOUT, timeout=timeout_s, env=env, cwd=ROOT).returncode
    except subprocess.TimeoutExpired:
        return {"bench": name, "error": f"timed out after {timeout_s:g} s", "log_tail": _tail(log), "seconds": round(time.perf_counter() - began, 2)}
    if code != 0 or not out.is_file():
        return {"bench": name, "error": f"exit code {code}", "log_tail": _tail(log), "seconds": round(time.perf_counter() - began, 2)}
    return json.loads(out.read_text())


def _tail(log: Path, lines: int = 12) -> list[str]:
    """The end of a failed benchmark's output (its log file goes away with the run's scratch folder)."""
    return log.read_text(errors="replace").strip().splitlines()[-lines:] if log.is_file() else []


def summarize(results: dict[str, dict]) -> list[dict]:
    """Every target of every benchmark in one list, and one failed entry per benchmark that errored."""
    rows = []
    for name, result in results.items():
        if "error" in result:
            rows.append({"bench": name, "name": "(benchmark failed)", "met": False, "error": result["error"]})
        rows += [{"bench": name, **t} for t in result.get("targets", [])]
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.run_all", description=__doc__.split("\n")[0])
    parser.add_argument("--only", type=lambda t: t.split(","), default=list(BENCHES), help=f"comma-separated of {','.join(BENCHES)}")
    parser.add_argument("--quick", action="store_true", help="tiny sizes, to check the suite runs")
    parser.add_argument("--models", default=common.DEFAULT_MODELS, help="folder of the tiny models (built there when absent)")
    parser.add_argument("--out", default=str(DEFAULT_OUT), help="where to write the JSON ('-': nowhere)")
    args = parser.parse_args(argv)
    unknown = [name for name in args.only if name not in BENCHES]
    if unknown:
        parser.error(f"unknown benchmark(s): {', '.join(unknown)}")

    began = time.perf_counter()
    report: dict = {"machine": common.machine(), "quick": args.quick, "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    results = {}
    with tempfile.TemporaryDirectory(prefix="bench_run_all_") as scratch:
        workdir = Path(scratch)
        for name in args.only:
            timeout_s, quick = BENCHES[name]
            extra = ["--models", args.models] + (quick if args.quick else [])
            results[name] = run_bench(name, extra, timeout_s, workdir)
    report["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    report["seconds"] = round(time.perf_counter() - began, 1)
    report["targets"] = summarize(results)
    report["benches"] = results
    if args.out != "-":
        common.emit(report, args.out)
    else:
        print(json.dumps(report, indent=2, default=str), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
