"""Audit benchmark: `expledger audit` on a ledger of the workload (bench/workload.py), against a rebuild of its library.

Usage: python -m bench.bench_audit [--ops N] [--model hashing] [--keep DIR]

Figures, from one run:
  audit         `ledger.audit.audit` on the ledger's latest view: reading the log, the reference fold (PROTOCOL
                §7, ledger/reference.py), the comparison (every record, status and latest vote), in seconds, and
                the process's resident set before and at its peak
  baseline      `Ledger.rebuild_library` of the same directory (the incremental engine folding the same log again
                from nothing); the ratio audit / rebuild
  command       `expledger audit --ledger DIR` as a process (opening the ledger and loading the model included):
                its line and exit status; then on copies of the directory with one record's support, one record's
                vote count, one record's absorbed list kept in it, and one list kept outside a record (the U table)
                altered in LevelDB: each must exit 1 naming the altered experience
"""

from __future__ import annotations

import argparse
import itertools
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench.workload import operations
from ledger.audit import audit
from ledger.cid import CID
from ledger.ledger import DB_DIR, Ledger
from ledger.params import NetworkParams
from ledger.records import ExperienceRecord, Life
from ledger.store import Store
from ledger.tables import EXPERIENCE, experience_key, listed_prefix

EXPLEDGER = Path(sys.executable).parent / "expledger"


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _build(path: Path, params: NetworkParams, count: int) -> float:
    """Ingest the workload in batches of 1,000; returns the seconds it took."""
    ledger = Ledger.open(path, params)
    start = time.perf_counter()
    stream = operations(count, params)
    try:
        while batch := list(itertools.islice(stream, 1000)):
            ledger.ingest([block.data for block in batch])
    finally:
        ledger.close()
    return time.perf_counter() - start


def _timed_audit(path: Path, params: NetworkParams) -> tuple[str, dict[str, float], float]:
    """The audit's line, the seconds of each stage, and the resident set's peak in MB."""
    ledger = Ledger.open(path, params)
    stages: dict[str, float] = {}
    clock = [time.perf_counter()]

    def progress(stage: str, done: int, of: int) -> None:
        if done == of:
            now = time.perf_counter()
            stages[stage] = stages.get(stage, 0.0) + now - clock[0]
            clock[0] = now

    try:
        line = audit(ledger.view(), params, progress).line()
    finally:
        ledger.close()
    return line, stages, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _rebuild_seconds(path: Path, params: NetworkParams) -> float:
    ledger = Ledger.open(path, params)
    try:
        start = time.perf_counter()
        ledger.rebuild_library()
        return time.perf_counter() - start
    finally:
        ledger.close()


def _altered_copy(path: Path, copy: Path, change: Callable[[Store], bytes | None]) -> bytes | None:
    """A copy of the data directory with one change made in its LevelDB; returns the experience it altered (None:
    nothing to alter at this size)."""
    shutil.copytree(path, copy)
    store = Store(copy / DB_DIR, create=False)
    try:
        return change(store)
    finally:
        store.close()


def _record_change(alter: Callable[[ExperienceRecord], None]) -> Callable[[Store], bytes | None]:
    """Alter the first record that stands for itself and keeps its list of absorbed adds in it."""

    def change(store: Store) -> bytes | None:
        for _, raw in store.scan(EXPERIENCE):
            try:
                record = ExperienceRecord.unpack(raw)
            except ValueError:  # keeps a list outside it
                continue
            if record.status is not Life.ALIAS and record.absorbed:
                alter(record)
                store.write({experience_key(record.id.raw): record.pack()})
                return record.id.raw
        return None

    return change


def _drop_listed(store: Store) -> bytes | None:
    """Delete one id of a list kept outside its record (the U table)."""
    for _, raw in store.scan(EXPERIENCE):
        try:
            ExperienceRecord.unpack(raw)
        except ValueError:
            exp_id = ExperienceRecord.unpack(raw, lambda cid, tag, digest: []).id.raw
            key = next(key for key, _ in store.scan(listed_prefix(exp_id, b"a")))
            store.write({key: None})
            return exp_id
    return None


def _bump_support(record: ExperienceRecord) -> None:
    record.support += 1


def _bump_votes(record: ExperienceRecord) -> None:
    record.up += 1


def _drop_absorbed(record: ExperienceRecord) -> None:
    record.absorbed.pop()


def _command(path: Path, network: Path) -> tuple[int, str, float]:
    start = time.perf_counter()
    done = subprocess.run(
        [str(EXPLEDGER), "--network", str(network), "audit", "--ledger", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    return done.returncode, done.stdout.strip() or done.stderr.strip(), time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=100_000)
    parser.add_argument("--model", choices=["default", "hashing"], default="default", help="the network's embedder")
    args = parser.parse_args(argv)
    params = NetworkParams(**({} if args.model == "default" else {"embedding_model": "feature-hash-v1"}))
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as tmp:
        path, network = Path(tmp) / "node", Path(tmp) / "network.json"
        network.write_text(params.to_json())
        built = _build(path, params, args.ops)
        print(f"built {args.ops:,} operations in {built:.1f} s ({args.ops / built:,.0f} ops/s)", flush=True)
        before = _rss_mb()
        start = time.perf_counter()
        line, stages, peak = _timed_audit(path, params)
        audited = time.perf_counter() - start
        print(f"audit: {audited:.1f} s ({', '.join(f'{stage} {seconds:.1f} s' for stage, seconds in stages.items())})")
        print(f"  {line}")
        print(f"  resident set {before:.0f} MB before, peak {peak:.0f} MB")
        rebuilt = _rebuild_seconds(path, params)
        print(f"baseline: rebuild_library {rebuilt:.1f} s; ratio audit / rebuild {audited / rebuilt:.2f}")
        status, said, seconds = _command(path, network)
        print(f"command: exit {status} in {seconds:.1f} s: {said}")
        failures = int(status != 0)
        alterations = {
            "support": _record_change(_bump_support),
            "vote count": _record_change(_bump_votes),
            "absorbed list": _record_change(_drop_absorbed),
            "list kept outside": _drop_listed,
        }
        for number, (name, change) in enumerate(alterations.items()):
            copy = Path(tmp) / f"altered{number}"
            altered = _altered_copy(path, copy, change)
            if altered is None:
                print(f"altered {name}: no such record at {args.ops:,} operations")
                continue
            status, said, seconds = _command(copy, network)
            caught = status == 1 and str(CID(altered)) in said
            failures += not caught
            print(f"altered {name}: exit {status} in {seconds:.1f} s, names it: {caught}: {said[:160]}")
            shutil.rmtree(copy)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
