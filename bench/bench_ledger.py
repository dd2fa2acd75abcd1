"""Ledger storage benchmark: ingest, restart, bytes on disk, and the cost of a late operation.

Usage: python -m bench.bench_ledger [--ops N] [--batch B]

Figures, all from one run on the same operations:
  ingest        validate + check embeddings + store + log + fold + index, ops/s, and its ratio to
                decode+validate+verify of the same operations (the ledger-core figure); target >= 0.25
  duplicates    the same operations submitted again: ignored before decoding or checking a
                signature; their cost per operation as a share of a new one's (target < 0.1)
  restart       opening the data directory again (target < 1 s)
  disk          bytes on disk per operation (after LevelDB compaction)
  late op       one operation whose clock sorts it before the newest K applied ones: the fold
                undoes and redoes those K, so the cost grows with K
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench.workload import operations
from ledger.embedder import embedder_for, pack_float16
from ledger.ingest import Verdict
from ledger.keys import AuthorKey
from ledger.ledger import Ledger
from ledger.ops import Embedding, Experience, Kind, Operation, sign
from ledger.params import NetworkParams
from ledger.validation import validate


def _disk_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _late_add(ledger: Ledger, params: NetworkParams, behind: int, serial: int) -> float:
    """Submit an add whose clock puts it `behind` operations before the newest; return seconds taken."""
    applied = ledger.view().applied_in_order()
    anchor = applied[-behind - 1] if behind < len(applied) else applied[0]
    clock = ledger.view().clock(anchor)
    embedder = embedder_for(params)
    text = f"When a late insight arrives, fold it in order and check it against case number {'x' * serial}."
    content = Experience(
        text, ("bench",), 0.5, Embedding(embedder.model_id, embedder.dim, pack_float16(embedder.embed([text])[0]))
    )
    block = sign(Operation(Kind.ADD, "", clock, (), 1_700_000_000, content=content), AuthorKey(bytes([99]) * 32))
    start = time.perf_counter()
    outcome = ledger.submit(block.data)
    elapsed = time.perf_counter() - start
    assert outcome.verdict is Verdict.ACCEPTED, outcome
    return elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=1000, help="operations per ingest batch (one synced write)")
    parser.add_argument(
        "--model",
        choices=["default", "hashing"],
        default="default",
        help="the network's embedder: the default model, or feature hashing",
    )
    args = parser.parse_args(argv)
    params = NetworkParams() if args.model == "default" else NetworkParams(embedding_model="feature-hash-v1")

    print(f"generating {args.ops:,} signed operations ...", file=sys.stderr, flush=True)
    datas = [block.data for block in operations(args.ops, params)]

    start = time.perf_counter()
    for data in datas:
        validate(data, params)
    validate_rate = len(datas) / (time.perf_counter() - start)

    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as tmp:
        path = Path(tmp) / "node"
        ledger = Ledger.open(path, params)
        start = time.perf_counter()
        last_report = start
        for index in range(0, len(datas), args.batch):
            outcomes = ledger.ingest(datas[index : index + args.batch])
            assert all(o.verdict is Verdict.ACCEPTED for o in outcomes), outcomes[0]
            if time.perf_counter() - last_report > 5:
                last_report = time.perf_counter()
                done = index + args.batch
                rate = done / (last_report - start)
                print(f"  ingested {done:,}/{len(datas):,} ({rate:,.0f} ops/s)", file=sys.stderr, flush=True)
        ingest_rate = len(datas) / (time.perf_counter() - start)
        view = ledger.view()
        assert view.pending() == []
        live = len(view.live_ids())
        assert len(ledger.indexed()) == live

        again = datas[: min(len(datas), 20_000)]
        start = time.perf_counter()
        for index in range(0, len(again), args.batch):
            assert all(o.outcome == "duplicate" for o in ledger.ingest(again[index : index + args.batch]))
        duplicate_rate = len(again) / (time.perf_counter() - start)

        late = {}
        for behind in (0, 10, 100, 1000):
            late[behind] = statistics.median(
                _late_add(ledger, params, behind, i) for i in range(3 * behind, 3 * behind + 3)
            )
        ledger.store._db.compact_range()
        ledger.close()
        disk = _disk_bytes(path)

        restarts = []
        for _ in range(5):
            start = time.perf_counter()
            ledger = Ledger.open(path, params)
            restarts.append(time.perf_counter() - start)
            ledger.close()

    print(
        f"{len(datas):,} operations ({live:,} live experiences at the end), batches of {args.batch}, "
        f"embedder {params.embedding_model}"
    )
    print(f"  decode+validate+verify   {validate_rate:>9,.0f} ops/s  (baseline, same operations)")
    print(
        f"  ingest                   {ingest_rate:>9,.0f} ops/s  ratio {ingest_rate / validate_rate:.2f} "
        f"(target >= 0.25: {'met' if ingest_rate / validate_rate >= 0.25 else 'NOT met'})"
    )
    share = ingest_rate / duplicate_rate
    print(
        f"  duplicates               {duplicate_rate:>9,.0f} ops/s  cost {share:.3f} of a new operation's "
        f"(target < 0.1: {'met' if share < 0.1 else 'NOT met'})"
    )
    print(f"  restart (median of 5)    {statistics.median(restarts) * 1000:>9,.1f} ms     (target < 1000 ms)")
    mean_op = statistics.mean(map(len, datas))
    print(f"  disk                     {disk / len(datas):>9,.0f} bytes/op (mean operation {mean_op:,.0f} bytes)")
    for behind, seconds in late.items():
        print(f"  late op, {behind:>5} behind     {seconds * 1000:>9,.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
