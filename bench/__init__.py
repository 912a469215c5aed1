"""Benchmarks: each module prints JSON; `python -m bench.run_all` runs them all (see README, Benchmarks)."""
