"""Where a writer's time goes: one window of ingest at a given size, phase by phase, with queries running.

Usage: python -m bench.bench_window [--at 100000] [--width 10000] [--no-queries] [--keep DIR | --start-from DIR]

The ledger is filled to `--at` operations of the workload (untimed), then the next `--width` are
ingested in batches of 1,000 while a thread retrieves every 50 ms (as bench_ledger does). For the
window it prints the writer's CPU (`time.thread_time`) and wall time per operation in each phase
of `Ledger.ingest`, the other threads' CPU, the longest full garbage collection, and the queries'
latency. CPU per phase is the figure to
compare between two versions on a shared machine; wall time shows what the writer waited for.
The writer's CPU is also given per unit of the signature threads' CPU: they do the same work per
operation in every version, so the machine's speed, which moves by tens of percent within minutes
here, cancels out. `--keep DIR` keeps the filled directory (before the window); `--start-from DIR`
starts each run from a copy of such a directory instead of filling (at 1M operations filling takes
~10 minutes, the copy seconds), so versions can be run in turn on the same data.
This is the tool behind the figures of bench/RESULTS.md "The ledger at scale".
"""

from __future__ import annotations

import argparse
import gc
import itertools
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ledger.ingest as ingest_module
import ledger.ledger as ledger_module
from bench.bench_ledger import _by_thread, _process_cpu, _Querier, _rss_mb, _threads_cpu
from bench.workload import operations
from ledger.ledger import Ledger
from ledger.params import NetworkParams

#: (module or class, function name, label): the phases of one `Ledger.ingest`, in order
PHASES = (
    (ledger_module, "triage", "triage (decode, validate)"),
    (ledger_module, "check_embeddings", "embedding check"),
    (ledger_module, "settle_signatures", "signature wait"),
    (ingest_module.Batch, "store", "store + fold"),
    (ingest_module.Batch, "commit", "commit (synced write)"),
    (ledger_module.LedgerView, "status", "receipts' statuses"),
)


class PhaseClock:
    """Wraps functions to add up the writer's CPU and wall time in each (only while `on`)."""

    def __init__(self) -> None:
        self.on = False
        self.spent: dict[str, list[float]] = {}

    def wrap(self, owner: Any, name: str, label: str) -> None:
        original: Callable[..., Any] = getattr(owner, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            if not self.on or threading.current_thread() is not threading.main_thread():
                return original(*args, **kwargs)
            cpu, wall = time.thread_time(), time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                totals = self.spent.setdefault(label, [0.0, 0.0])
                totals[0] += time.thread_time() - cpu
                totals[1] += time.perf_counter() - wall

        setattr(owner, name, timed)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--at", type=int, default=100_000, help="operations ingested before the window")
    parser.add_argument("--width", type=int, default=10_000, help="operations in the window")
    parser.add_argument("--no-queries", action="store_true", help="no thread retrieving during the window")
    kept = parser.add_mutually_exclusive_group()
    kept.add_argument("--keep", type=Path, help="keep the filled data directory here (it must not exist)")
    kept.add_argument("--start-from", type=Path, help="a directory kept by --keep at the same --at, copied")
    args = parser.parse_args(argv)
    if args.keep is not None and args.keep.exists():
        parser.error(f"--keep: {args.keep} exists")
    if args.start_from is not None and not args.start_from.is_dir():
        parser.error(f"--start-from: {args.start_from} is not a directory")
    params = NetworkParams()
    clock = PhaseClock()
    for owner, name, label in PHASES:
        clock.wrap(owner, name, label)
    pauses: list[float] = []
    started = [0.0]

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if info["generation"] == 2:
            if phase == "start":
                started[0] = time.perf_counter()
            else:
                pauses.append(time.perf_counter() - started[0])

    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as tmp:
        path = Path(tmp) / "node"
        stream = (block.data for block in operations(args.at + args.width, params))
        if args.start_from is not None:
            shutil.copytree(args.start_from, path)
            ledger = Ledger.open(path, params)
            gc.freeze()  # as the daemon does once started
            held = ledger.view().log_size
            if held != args.at:
                ledger.close()
                parser.error(f"--start-from: {args.start_from} holds {held:,} operations, not --at {args.at:,}")
            for done, _ in enumerate(itertools.islice(stream, args.at), 1):  # the workload must be generated anyway
                if done % 50_000 == 0:
                    print(f"  generated {done:,}/{args.at:,}", file=sys.stderr, flush=True)
        else:
            ledger = Ledger.open(path, params)
            gc.freeze()
            done = 0
            while done < args.at:
                ledger.ingest(list(itertools.islice(stream, min(1000, args.at - done))))
                done += min(1000, args.at - done)
                if done % 50_000 == 0:
                    print(f"  filled {done:,}/{args.at:,}", file=sys.stderr, flush=True)
            if args.keep is not None:
                ledger.close()
                shutil.copytree(path, args.keep)
                ledger = Ledger.open(path, params)
        window = list(itertools.islice(stream, args.width))
        querier = None if args.no_queries else _Querier(ledger)
        gc.callbacks.append(on_gc)
        clock.on = True
        threads_before = _threads_cpu()
        cpu_before, writer_before, wall_before = _process_cpu(), time.thread_time(), time.perf_counter()
        if querier:
            querier.start()
        for start in range(0, len(window), 1000):
            ledger.ingest(window[start : start + 1000])
        wall = time.perf_counter() - wall_before
        writer = time.thread_time() - writer_before
        others = _process_cpu() - cpu_before - writer
        by_thread = _by_thread(threads_before, others, len(window))
        clock.on = False
        gc.callbacks.remove(on_gc)
        if querier:
            querier.done.set()
            querier.join()
        live = ledger.live_count()
        ledger.close()

    per_op = 1e6 / len(window)
    print(f"window of {len(window):,} operations after {args.at:,} ({live:,} live), load {os.getloadavg()[0]:.2f}")
    print(
        f"  ingest wall {wall * per_op:6.0f} us/op, writer CPU {writer * per_op:6.0f} us/op, other threads' CPU "
        f"{others * per_op:6.0f} us/op; RSS {_rss_mb():,.0f} MB"
    )
    for label, cpu in by_thread.items():
        print(f"    {label + ':':26} CPU {cpu * 1e6:6.0f} us/op")
    signatures = by_thread.get("ledger-verify", 0.0)  # in clock ticks: a short window may show none
    per_unit = f"{writer / len(window) / signatures:6.2f}" if signatures > 0 else "   n/a (none measured)"
    print(f"  writer CPU per unit of the signature threads' {per_unit}")
    for _, _, label in PHASES:
        cpu_s, wall_s = clock.spent.get(label, (0.0, 0.0))
        print(f"    {label:26} CPU {cpu_s * per_op:6.0f} us/op   wall {wall_s * per_op:6.0f} us/op")
    if pauses:
        print(f"  full garbage collections   {len(pauses)}, longest {max(pauses) * 1000:.1f} ms")
    if querier and querier.latencies:
        lat = sorted(querier.latencies)
        print(
            f"  queries {len(lat):,}: p50 {lat[len(lat) // 2] * 1000:.1f} ms, "
            f"p99 {lat[int(len(lat) * 0.99)] * 1000:.1f} ms, longest {lat[-1] * 1000:.1f} ms"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
