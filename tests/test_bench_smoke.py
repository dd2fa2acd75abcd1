"""The ledger benchmarks the README quotes still run: each at a tiny size, as a process, printing its figures."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _run(tmp_path: Path, *args: str) -> str:
    env = {**os.environ, "BENCH_DIR": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, "-m", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


def test_bench_ledger_prints_every_figure(tmp_path: Path) -> None:
    out = _run(tmp_path, "bench.bench_ledger", "--ops", "2000", "--checkpoints", "1000", "--batch", "100")
    for figure in ("decode+validate+verify", "ingest per tenth", "last tenth / first", "late add", "queries during"):
        assert figure in out, out


def test_bench_window_prints_every_phase(tmp_path: Path) -> None:
    out = _run(tmp_path, "bench.bench_window", "--at", "1000", "--width", "1000")
    for phase in ("triage", "embedding check", "signature wait", "store + fold", "commit", "receipts", "queries"):
        assert phase in out, out
