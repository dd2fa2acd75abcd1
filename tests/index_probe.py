"""Index probe for the damaged-file test: open each data directory twice and print what it answers.

Usage: python -m tests.index_probe DATA_DIR...
It runs in a process of its own because usearch, handed a damaged file, can crash the interpreter
(a segmentation fault): the test then sees the exit code instead of losing the test run.
Prints `OPEN <dir>` before each open (the last one names the culprit of a crash), then one JSON
line: the directory, the index status, the indexed and the live ids, the answers to QUERIES.
"""

import json
import sys
from pathlib import Path

from ledger.retrieval import Retriever
from tests.ledgers import ACTIONS, CONTEXTS, open_ledger

QUERIES = [f"When {context}, {action}." for context in CONTEXTS for action in ACTIONS[:2]]


def main() -> None:
    for directory in sys.argv[1:]:
        for attempt in (1, 2):  # the second open shows whether the repaired index was saved
            print(f"OPEN {directory}", flush=True)
            ledger = open_ledger(Path(directory))
            retriever = Retriever(ledger)
            report = {
                "dir": directory,
                "attempt": attempt,
                "status": ledger.index_status,
                "indexed": sorted(exp_id.hex() for exp_id in ledger.indexed()),
                "live": sorted(cid.raw.hex() for cid in ledger.view().live_ids()),
                "answers": [
                    [[str(hit.id), hit.score] for hit in retriever.retrieve(query, k=5, threshold=-1.0)]
                    for query in QUERIES
                ],
            }
            ledger.close()
            print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
