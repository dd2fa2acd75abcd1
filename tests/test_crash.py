"""kill -9 at random moments loses nothing acknowledged, and the log only ever grows consistently."""

import os
import random
import select
import subprocess
import sys
import time
from pathlib import Path

import plyvel

from ledger import ledger as ledger_module
from ledger.cid import CID
from ledger.ledger import DB_DIR
from ledger.proofs import verify_consistency
from ledger.tables import REBUILDING
from tests.ledgers import converged_state, open_ledger, random_history

RUNS = 20
ROOT = Path(__file__).resolve().parent.parent


def _run_worker(data_dir: Path, ops_file: Path, seed: int, start: int, kill_after: float | None) -> list[str]:
    """The worker's lines; killed `kill_after` seconds after its first acknowledgement (its start-up, seconds long
    on a loaded machine, does not count), or run to its end if None."""
    worker = subprocess.Popen(
        [sys.executable, "-m", "tests.crash_worker", str(data_dir), str(ops_file), str(seed), str(start)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    if kill_after is None:
        out, err = worker.communicate(timeout=300)
        assert worker.returncode == 0, err
        return out.splitlines()
    try:
        first = _first_line(worker)
        time.sleep(kill_after)
    finally:
        worker.kill()  # SIGKILL: no cleanup, no flush beyond what was synced
    out, err = worker.communicate(timeout=60)
    assert first, f"the worker ended before it acknowledged anything: {err[-2000:]}"
    return (first + out).splitlines()


def _first_line(worker: subprocess.Popen[str], timeout: float = 120) -> str:
    """The worker's output up to its first newline, read from the pipe itself (`communicate` reads on from there;
    a buffered read would keep what follows from it); "" if it ended first."""
    assert worker.stdout is not None
    read, deadline = b"", time.monotonic() + timeout
    while b"\n" not in read:
        ready, _, _ = select.select([worker.stdout], [], [], max(0.0, deadline - time.monotonic()))
        assert ready, f"no acknowledgement within {timeout} s"
        chunk = os.read(worker.stdout.fileno(), 65536)
        if not chunk:
            return ""
        read += chunk
    return read.decode()


def test_kill_minus_nine_loses_nothing_acknowledged(tmp_path):
    rng = random.Random(2024)
    blocks = random_history(rng, 3000)
    ops_file = tmp_path / "ops.hex"
    ops_file.write_text("\n".join(b.data.hex() for b in blocks))
    data_dir = tmp_path / "node"
    acknowledged: set[str] = set()
    # the heads to prove consistent with the log after this run: this run's, and the log as it was after the last
    # run (proven then to extend every earlier head, so by transitivity every head acknowledged is checked)
    heads: list[tuple[int, bytes]] = []
    # a node that was never killed, given what the killed one logged in the same order: the library the killed
    # node holds after each restart must be the one these operations give (cheaper than a rebuild a run, and it
    # also catches a rebuild that repeats a wrong library)
    clean, copied = open_ledger(tmp_path / "clean"), 0
    for run in range(RUNS):
        lines = _run_worker(data_dir, ops_file, run, run * 150, kill_after=rng.uniform(0.05, 1.0))
        assert "DONE" not in lines, f"run {run} finished before it was killed"
        for line in lines:
            if line.startswith("ACK"):
                cids, head = line[4:].split(" | ")
                acknowledged.update(cids.split())
                size, root = head.split()
                heads.append((int(size), bytes.fromhex(root)))
        ledger = open_ledger(data_dir)
        for cid in acknowledged:
            assert ledger.view().has(CID.parse(cid)), f"run {run}: acknowledged {cid} was lost"
        size, root = ledger.view().log_size, ledger.view().merkle.root()
        clean.ingest(ledger.view().entries(copied, size))
        copied = size
        assert converged_state(ledger) == converged_state(clean), f"run {run}: library differs from a clean node's"
        for old_size, old_root in heads:
            if old_size:
                proof = ledger.view().merkle.consistency_path(old_size, size)
                assert verify_consistency(old_size, size, old_root, root, proof), (run, old_size, size)
        heads = [(size, root)]
        ledger.close()
    clean.close()
    assert _run_worker(data_dir, ops_file, RUNS, 0, kill_after=None)[-1] == "DONE"
    finished, clean = open_ledger(data_dir), open_ledger(tmp_path / "whole")
    clean.ingest([b.data for b in blocks])
    assert finished.view().log_size == len({b.cid for b in blocks})
    assert converged_state(finished) == converged_state(clean)
    assert len(acknowledged) > 0
    finished.close()
    clean.close()


#: a rebuild in chunks of 20 that stops, as if hung, once it has folded 100 operations again: the test kills it there
_REBUILD_UNTIL_HALFWAY = """
import logging, sys, threading
from pathlib import Path
import ledger.ledger
from tests.ledgers import open_ledger

class Halfway(logging.Handler):
    def emit(self, record):
        if record.getMessage().startswith("refolded 100/"):
            print("halfway", flush=True)
            threading.Event().wait()

ledger.ledger._REBUILD_CHUNK = 20
logging.getLogger("ledger.ledger").addHandler(Halfway())
logging.getLogger("ledger.ledger").setLevel(logging.INFO)
open_ledger(Path(sys.argv[1])).rebuild_library()
"""


def test_a_rebuild_killed_halfway_is_begun_again_at_the_next_open(tmp_path):
    """The library is cleared and folded again a chunk per synced write: killed between two, the database holds
    part of it, and the next open rebuilds it from the start (the applied operations' order is never cleared)."""
    blocks = random_history(random.Random(31), 300)
    node = tmp_path / "node"
    ledger = open_ledger(node)
    ledger.ingest([b.data for b in blocks])
    state = converged_state(ledger)
    ledger.close()
    worker = subprocess.Popen(
        [sys.executable, "-c", _REBUILD_UNTIL_HALFWAY, str(node)], stdout=subprocess.PIPE, text=True, cwd=ROOT
    )
    try:
        assert worker.stdout is not None and worker.stdout.readline() == "halfway\n"
    finally:
        worker.kill()
        worker.wait(timeout=60)
    db = plyvel.DB(str(node / DB_DIR))
    assert db.get(REBUILDING) is not None, "killed before the rebuild ended"
    db.close()
    ledger = open_ledger(node)
    assert ledger.store.get(REBUILDING) is None
    assert converged_state(ledger) == state
    ledger.close()


def test_a_rebuild_in_chunks_folds_the_library_the_operations_give(tmp_path, monkeypatch):
    """Each chunk is folded on top of the ones before, as if its operations had arrived after them."""
    blocks = random_history(random.Random(32), 200)
    random.Random(33).shuffle(blocks)
    ledger = open_ledger(tmp_path / "node")
    for start in range(0, len(blocks), 9):
        ledger.ingest([b.data for b in blocks[start : start + 9]])
    state = converged_state(ledger)
    monkeypatch.setattr(ledger_module, "_REBUILD_CHUNK", 7)
    ledger.rebuild_library()
    assert converged_state(ledger) == state and ledger.store.get(REBUILDING) is None
    ledger.close()
