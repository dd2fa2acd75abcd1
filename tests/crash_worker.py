"""Crash-test worker: ingest operations from a file in small batches, printing what each batch acknowledged.

Usage: python -m tests.crash_worker DATA_DIR OPS_FILE SEED START
(START rotates the list, so successive runs mostly ingest operations the node does not have yet)
Each line printed after a durable commit: `ACK <cid> ... | <log size> <root hex>`.
"""

import random
import sys
from pathlib import Path

from ledger.ledger import Ledger
from tests.factories import PARAMS


def main() -> None:
    data_dir, ops_file, seed, start = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    items = [bytes.fromhex(line) for line in ops_file.read_text().split()]
    items = items[start:] + items[:start]
    rng = random.Random(seed)
    ledger = Ledger.open(data_dir, PARAMS)
    index = 0
    while index < len(items):
        batch = items[index : index + rng.randint(1, 5)]
        index += len(batch)
        outcomes = ledger.ingest(batch)
        cids = " ".join(str(o.cid) for o in outcomes if o.outcome != "invalid")
        print(f"ACK {cids} | {ledger.view().log_size} {ledger.view().merkle.root().hex()}", flush=True)
    print("DONE", flush=True)


if __name__ == "__main__":
    main()
