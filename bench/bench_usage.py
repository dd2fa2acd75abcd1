"""What counting a serve costs (node/usage.py): a synced LevelDB write per serve, against the same writes unsynced.

Usage: python -m bench.bench_usage [--serves 2000] [--hits 5] [--threads 8]

Each serve records `--hits` experiences (a retrieve of k=5) in one write batch, as `retrieve`, `context` and the
proxy do. Printed: microseconds per serve both ways and their ratio. The synced figure is what a serve adds to an
answer's latency (for scale: a retrieval itself takes milliseconds, bench/bench_retrieval.py). The disk decides
it: on a shared machine and its virtual disk, say so when quoting it.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time
from pathlib import Path

from ledger.cid import CID
from node.usage import UsageStats


def per_serve(path: Path, serves: int, hits: int, sync: bool, threads: int = 1) -> float:
    """Seconds per serve, `threads` recording at once (as the node's reader threads do)."""
    ids = [CID.parse("bafyreifq7r2uherxem24ty3bsgpnav5eoxltdpwhpdksbvpsg77kdl3axu")]
    ids += [CID(ids[0].raw[:-4] + index.to_bytes(4, "big")) for index in range(1, 64)]
    stats = UsageStats(path, sync=sync)

    def serve_some(first: int) -> None:
        for serve in range(first, serves, threads):
            chosen = [(ids[(serve + offset) % len(ids)], "math.geometry") for offset in range(hits)]
            stats.record(chosen, "retrieve", "math" if serve % 2 else None)

    try:
        started = time.perf_counter()
        workers = [threading.Thread(target=serve_some, args=(first,)) for first in range(threads)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        elapsed = time.perf_counter() - started
        assert sum(usage.count for _, usage in stats.top(len(ids))) == serves * hits
        return elapsed / serves
    finally:
        stats.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--serves", type=int, default=2000)
    parser.add_argument("--hits", type=int, default=5)
    parser.add_argument("--threads", type=int, default=8, help="serves recorded at once (the node's reader threads)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as tmp:
        synced = per_serve(Path(tmp) / "synced", args.serves, args.hits, sync=True)
        unsynced = per_serve(Path(tmp) / "unsynced", args.serves, args.hits, sync=False)
        grouped = per_serve(Path(tmp) / "grouped", args.serves, args.hits, sync=True, threads=args.threads)
    print(f"usage counts: {args.serves} serves of {args.hits} experiences each, load average {os.getloadavg()[0]:.1f}")
    print(f"synced, one thread (as the node writes): {synced * 1e6:8.0f} us per serve")
    print(f"unsynced, one thread (baseline):         {unsynced * 1e6:8.0f} us per serve")
    print(f"synced, {args.threads} threads at once (group commit): {grouped * 1e6:8.0f} us per serve")
    print(f"ratio synced / unsynced: {synced / unsynced:.1f}x; {args.threads} threads / one: {grouped / synced:.2f}x")


if __name__ == "__main__":
    main()
