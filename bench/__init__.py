"""Benchmarks. `ledger` is imported first: it must load before usearch (see ledger/__init__.py)."""

import ledger  # noqa: F401
