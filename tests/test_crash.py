"""kill -9 at random moments loses nothing acknowledged, and the log only ever grows consistently."""

import random
import subprocess
import sys
import time
from pathlib import Path

from ledger.cid import CID
from ledger.proofs import verify_consistency
from tests.ledgers import converged_state, open_ledger, random_history

RUNS = 20
ROOT = Path(__file__).resolve().parent.parent


def _run_worker(data_dir: Path, ops_file: Path, seed: int, start: int, kill_after: float | None) -> list[str]:
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
    else:
        time.sleep(kill_after)
        worker.kill()  # SIGKILL: no cleanup, no flush beyond what was synced
        out, _ = worker.communicate(timeout=60)
    return out.splitlines()


def test_kill_minus_nine_loses_nothing_acknowledged(tmp_path):
    rng = random.Random(2024)
    blocks = random_history(rng, 3000)
    ops_file = tmp_path / "ops.hex"
    ops_file.write_text("\n".join(b.data.hex() for b in blocks))
    data_dir = tmp_path / "node"
    acknowledged: set[str] = set()
    heads: list[tuple[int, bytes]] = []
    for run in range(RUNS):
        lines = _run_worker(data_dir, ops_file, run, run * 150, kill_after=rng.uniform(0.7, 1.7))
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
        state = converged_state(ledger)
        ledger.rebuild_library()
        assert converged_state(ledger) == state, f"run {run}: library differs from a clean rebuild"
        size, root = ledger.view().log_size, ledger.view().merkle.root()
        for old_size, old_root in heads:
            if old_size:
                proof = ledger.view().merkle.consistency_path(old_size, size)
                assert verify_consistency(old_size, size, old_root, root, proof), (run, old_size, size)
        ledger.close()
    assert _run_worker(data_dir, ops_file, RUNS, 0, kill_after=None)[-1] == "DONE"
    finished, clean = open_ledger(data_dir), open_ledger(tmp_path / "clean")
    clean.ingest([b.data for b in blocks])
    assert finished.view().log_size == len({b.cid for b in blocks})
    assert converged_state(finished) == converged_state(clean)
    assert len(acknowledged) > 0
    finished.close()
    clean.close()
