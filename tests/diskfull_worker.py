"""Fault-injection worker: a write that fails halfway through a batch, then more writes, then kill -9 (or a close).

Usage: python -m tests.diskfull_worker DATA_DIR OPS_FILE TARGET PAST END
TARGET is the file the failing write tears: `leveldb` (LevelDB's write-ahead log) or `blocks` (the block file the
batch appends to). The worker ingests a first part of the operations, then lowers RLIMIT_FSIZE to the target's
size plus PAST bytes, so the next batch's write stops there (EFBIG, as ENOSPC stops a write on a full disk: a
real short write inside LevelDB or the block files, then an error), then lifts the limit ("space is back") and
ingests the rest, the failed batch's operations among them. END: `kill` (SIGKILL itself), `close`, `torn`
(SIGKILL itself right after the failed write, before anything recovers), or `stuck` (the next write tries to recover
while no table fits, so LevelDB's memtable flush fails and it refuses every write; one more write with the limit
lifted, then SIGKILL). For `leveldb` block segments are made small, so the LevelDB log is the only file the limit
reaches; for `blocks` the block flush fails first.

Prints `ACK <cid> ...` after each acknowledged batch, `FAILED <code> <message>` for the batch that failed,
`REFUSED <code> <message>` for a write refused while the store could not recover, `TORN <size> <limit>` with the
torn file's size and the limit, `STUCK`/`STILL <code> <message>` for the writes refused in the `stuck` ending.
"""

import resource
import signal
import sys
from pathlib import Path

from ledger import blockfile
from ledger.errors import LedgerError
from ledger.ledger import Ledger
from tests.ledgers import open_ledger

SEGMENT_BYTES = 8 * 1024  # each segment holds a few operations: every block file stays far below the log
BATCH = 8
FIRST = 96  # operations acknowledged before the failed write
FAILING = 32  # operations in the batch whose write fails (its LevelDB record spans more than one 32 KB log block)
STUCK_LIMIT = 1000  # bytes: no table LevelDB writes fits


def _ack(ledger: Ledger, items: list[bytes]) -> None:
    receipts = ledger.ingest(items)
    print("ACK", " ".join(str(r.cid) for r in receipts if r.outcome != "invalid"), flush=True)


def _target(ledger: Ledger, target: str) -> Path:
    if target == "leveldb":
        return max(ledger.store.path.glob("*.log"), key=lambda path: int(path.stem))
    return max((ledger.store.path / blockfile.BLOCKS_DIR).glob("*.blk"))


def _refused(ledger: Ledger, items: list[bytes], label: str) -> None:
    """Ingest `items`, which the store must refuse; print the label, the code and the message."""
    try:
        ledger.ingest(items)
    except LedgerError as exc:
        print(label, exc.code, exc.message, flush=True)


def _fail_halfway(ledger: Ledger, failing: list[bytes], target: str, past: int) -> None:
    """Ingest `failing` with the target's size limited to `past` bytes more than it holds; the limit stays."""
    torn = _target(ledger, target)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead of killing us
    limit = torn.stat().st_size + past
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
    _refused(ledger, failing, "FAILED")
    print("TORN", torn.stat().st_size, limit, flush=True)


def _lift_limit() -> None:
    hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
    resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))


def main() -> None:
    data_dir, ops_file, target, past, end = Path(sys.argv[1]), Path(sys.argv[2]), *sys.argv[3:6]
    if target == "leveldb":
        blockfile.SEGMENT_BYTES = SEGMENT_BYTES
    items = [bytes.fromhex(line) for line in ops_file.read_text().split()]
    failing = items[FIRST : FIRST + FAILING]
    ledger = open_ledger(data_dir)
    for start in range(0, FIRST, BATCH):
        _ack(ledger, items[start : start + BATCH])
    _fail_halfway(ledger, failing, target, int(past))
    if end == "stuck":  # recovering fails: LevelDB cannot write its memtable into a table
        resource.setrlimit(resource.RLIMIT_FSIZE, (STUCK_LIMIT, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
        _refused(ledger, failing, "STUCK")
    _lift_limit()
    if end == "stuck":
        _refused(ledger, failing, "STILL")
    if end in ("torn", "stuck"):
        signal.raise_signal(signal.SIGKILL)
    ledger.store.min_free_bytes = 1 << 62  # no room to recover: the store stays stopped and says so
    _refused(ledger, failing, "REFUSED")
    ledger.store.min_free_bytes = 0  # space is back: the next write recovers the store first
    for start in range(FIRST, len(items), BATCH):
        _ack(ledger, items[start : start + BATCH])
    print("DONE", flush=True)
    if end == "kill":
        signal.raise_signal(signal.SIGKILL)
    ledger.close()


if __name__ == "__main__":
    main()
