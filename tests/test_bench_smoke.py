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
    figures = ("decode+validate+verify", "ingest per tenth", "CPU per op, writer", "CPU per op, other threads")
    probes = ("late add", "largest component", "late near-duplicate", "late on early members", "queries during", "disk")
    for figure in (*figures, "last tenth / first", *probes):
        assert figure in out, out


def test_disk_counts_a_file_with_two_names_once(tmp_path: Path) -> None:
    from bench.bench_ledger import _disk_bytes

    (tmp_path / "links").mkdir()
    (tmp_path / "000005.ldb").write_bytes(b"x" * 1000)
    os.link(tmp_path / "000005.ldb", tmp_path / "links" / "000005.ldb")  # LevelDB's table links
    (tmp_path / "LOG").write_bytes(b"y" * 10)
    assert _disk_bytes(tmp_path) == 1010


def test_bench_window_prints_every_phase(tmp_path: Path) -> None:
    out = _run(tmp_path, "bench.bench_window", "--at", "1000", "--width", "1000")
    for phase in ("triage", "embedding check", "signature wait", "store + fold", "commit", "receipts", "queries"):
        assert phase in out, out
