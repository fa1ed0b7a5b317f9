"""Benchmarks, run as scripts (e.g. `python bench/bench_store.py`); results go to bench/results/."""
