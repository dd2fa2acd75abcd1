"""A write that fails (a full disk) stops writes until the store is back in its last good state: nothing acknowledged
is lost across kill -9 or a close, a store opens after any torn write, and a free-space reserve refuses writes before
the disk is full (issue 54).

The failing writes are real: tests/diskfull_worker.py lowers RLIMIT_FSIZE so that LevelDB's own write of its log, or
the block files' append, stops partway (EFBIG, which stops a write as ENOSPC does). A test on a real full disk (a
tmpfs the test mounts) is in test_diskfull_daemon.py.
"""

from __future__ import annotations

import errno
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from ledger import blockfile
from ledger.cid import CID
from ledger.store import StoreError
from node.config import Config, ConfigError, load_config, render_config
from tests.diskfull_worker import FAILING, FIRST
from tests.ledgers import open_ledger, random_history

ROOT = Path(__file__).resolve().parent.parent
OPERATIONS = 200


@pytest.fixture(scope="module")
def operations(tmp_path_factory) -> list[bytes]:
    return [block.data for block in random_history(random.Random(54), OPERATIONS)]


@pytest.fixture(scope="module")
def ops_file(tmp_path_factory, operations) -> Path:
    path = tmp_path_factory.mktemp("ops") / "ops.hex"
    path.write_text("\n".join(data.hex() for data in operations))
    return path


def _run_worker(data_dir: Path, ops_file: Path, target: str, past: int, end: str) -> list[str]:
    worker = subprocess.run(
        [sys.executable, "-m", "tests.diskfull_worker", str(data_dir), str(ops_file), target, str(past), end],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
    )
    assert worker.returncode == (0 if end == "close" else -signal.SIGKILL), worker.stderr[-3000:]
    return worker.stdout.splitlines()


def _acknowledged(lines: list[str]) -> set[CID]:
    return {CID.parse(cid) for line in lines if line.startswith("ACK ") for cid in line.split()[1:]}


def _check_the_failure(lines: list[str]) -> None:
    """The batch failed with the store's code and a message without paths or reprs, its write torn at the limit."""
    failed = [line for line in lines if line.startswith("FAILED ")]
    assert len(failed) == 1 and failed[0].startswith("FAILED store.unwritable the write failed (file too large)")
    assert "/" not in failed[0] and "b'" not in failed[0] and "Errno" not in failed[0]
    size, limit = next(line for line in lines if line.startswith("TORN ")).split()[1:]
    assert size == limit  # the write stopped partway: the file holds a torn record or block


@pytest.mark.parametrize("end", ["kill", "close"])
@pytest.mark.parametrize(("target", "past"), [("leveldb", 5), ("leveldb", 20_000), ("blocks", 700)])
def test_after_a_write_that_fails_halfway_writes_stop_recover_and_nothing_acknowledged_is_lost(
    tmp_path, ops_file, operations, target, past, end
):
    """The failed batch is refused, and so is the next write while the store cannot recover; once it can, writes
    go on (the failed batch's operations among them), and after kill -9 or a close every acknowledged operation is
    there and the whole store verifies (before the fix the writes after a torn LevelDB record went into the same
    log, and the next open stopped at it: store.corrupt, checksum mismatch)."""
    data_dir = tmp_path / "node"
    lines = _run_worker(data_dir, ops_file, target, past, end)
    _check_the_failure(lines)
    refused = next(line for line in lines if line.startswith("REFUSED "))
    assert refused.startswith("REFUSED store.unwritable the store takes no writes after a failed one"), refused
    assert lines[-1] == "DONE"
    acknowledged = _acknowledged(lines)
    assert acknowledged == {CID.for_block(data) for data in operations}
    ledger = open_ledger(data_dir)
    try:
        view = ledger.view()
        assert all(view.has(cid) for cid in acknowledged)
        assert view.log_size == OPERATIONS
        ledger.verify()
        assert ledger.writability().writable
    finally:
        ledger.close()


@pytest.mark.parametrize(("target", "past"), [("leveldb", 3), ("leveldb", 700), ("leveldb", 40_000), ("blocks", 1)])
def test_a_store_opens_after_a_torn_write_with_what_was_acknowledged_before_it(
    tmp_path, ops_file, operations, target, past
):
    """kill -9 right after the failed write, before any recovery: the next open drops the torn record (LevelDB) or
    the torn bytes (block files), and holds exactly what was acknowledged (a torn header, a torn payload, a record
    torn past a 32 KB log block)."""
    data_dir = tmp_path / "node"
    lines = _run_worker(data_dir, ops_file, target, past, "torn")
    _check_the_failure(lines)
    acknowledged = _acknowledged(lines)
    assert acknowledged == {CID.for_block(data) for data in operations[:FIRST]}
    ledger = open_ledger(data_dir)
    try:
        view = ledger.view()
        assert view.log_size == FIRST and all(view.has(cid) for cid in acknowledged)
        assert not any(view.has(CID.for_block(data)) for data in operations[FIRST : FIRST + FAILING])
        ledger.verify()
        receipts = ledger.ingest(operations[FIRST:])  # and it takes writes
        assert {receipt.cid for receipt in receipts} == {CID.for_block(data) for data in operations[FIRST:]}
        assert ledger.view().log_size == OPERATIONS
    finally:
        ledger.close()


def test_when_recovering_fails_writes_stay_stopped_and_a_restart_recovers_the_store(tmp_path, ops_file, operations):
    """LevelDB cannot write its memtable into a table while it recovers (no room for it): it refuses every write
    from then on, so the store stays stopped, says a restart is needed, and does not try again; after kill -9 the
    next open recovers from the logs (the torn one and the new, empty one) with what was acknowledged."""
    data_dir = tmp_path / "node"
    lines = _run_worker(data_dir, ops_file, "leveldb", 700, "stuck")
    _check_the_failure(lines)
    for prefix in ("STUCK ", "STILL "):
        refused = next(line for line in lines if line.startswith(prefix))
        assert refused.startswith(f"{prefix}store.unwritable the store takes no writes"), refused
        assert refused.endswith("restart the node); reads go on") and "/" not in refused, refused
    acknowledged = _acknowledged(lines)
    assert acknowledged == {CID.for_block(data) for data in operations[:FIRST]}
    ledger = open_ledger(data_dir)
    try:
        assert ledger.view().log_size == FIRST and all(ledger.view().has(cid) for cid in acknowledged)
        ledger.verify()
        ledger.ingest(operations[FIRST:])
        assert ledger.view().log_size == OPERATIONS
    finally:
        ledger.close()


def test_writes_under_the_free_space_reserve_are_refused_and_reads_go_on(tmp_path, operations):
    ledger = open_ledger(tmp_path / "node")
    try:
        ledger.ingest(operations[:20])
        before = ledger.view().state_root()
        ledger.store.min_free_bytes = ledger.writability().free_bytes + (1 << 30)
        with pytest.raises(StoreError) as refused:
            ledger.ingest(operations[20:40])
        assert refused.value.code == "store.unwritable"
        assert "under the reserve" in refused.value.message and "/" not in refused.value.message
        state = ledger.writability()
        assert (state.state, state.writable, state.reason) == ("reserve", False, "free space is under the reserve")
        assert ledger.view().state_root() == before and ledger.view().log_size == 20  # reads go on, nothing written
        ledger.store.min_free_bytes = 0
        ledger.ingest(operations[20:40])
        assert ledger.view().log_size == 40 and ledger.writability().state == "ok"
    finally:
        ledger.close()


def test_the_reserve_is_a_config_key_init_writes_and_checks(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text(render_config(Config()))
    assert load_config(path).store.min_free_mb == 512 and "min_free_mb = 512" in path.read_text()
    path.write_text("[store]\nmin_free_mb = 0\n")
    assert load_config(path).store.min_free_mb == 0
    for value, code in (("-1", "config.value"), ('"512"', "config.type"), ("2000000000", "config.value")):
        path.write_text(f"[store]\nmin_free_mb = {value}\n")
        with pytest.raises(ConfigError) as bad:
            load_config(path)
        assert bad.value.code == code and "[store] min_free_mb" in bad.value.message


def test_a_block_append_that_meets_a_full_disk_halfway_is_cut_back_before_writes_resume(
    tmp_path, operations, monkeypatch
):
    """ENOSPC as the kernel gives it: a short write first (what fits), then the error. The torn bytes past the
    committed end are cut away by the recovery, and the next append starts at the committed end."""
    ledger = open_ledger(tmp_path / "node")
    try:
        ledger.ingest(operations[:20])
        segment = ledger.store.path / blockfile.BLOCKS_DIR / "00000.blk"
        committed = segment.stat().st_size
        real_pwrite, calls = os.pwrite, []

        def full_disk(fd: int, data: bytes, offset: int) -> int:
            calls.append(len(data))
            if len(calls) == 1:
                return real_pwrite(fd, bytes(data[: len(data) // 2]), offset)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        monkeypatch.setattr(os, "pwrite", full_disk)
        with pytest.raises(StoreError) as failed:
            ledger.ingest(operations[20:40])
        assert len(calls) == 2 and segment.stat().st_size == committed + calls[0] // 2  # torn: half a batch
        assert failed.value.code == "store.unwritable"
        assert failed.value.message.startswith("the write failed (no space left on device)")
        state = ledger.writability()
        assert (state.state, state.reason) == ("stopped", "a write to the block files failed: no space left on device")
        monkeypatch.undo()  # space is back
        ledger.ingest(operations[20:40])
        assert ledger.writability().state == "ok" and ledger.view().log_size == 40
    finally:
        ledger.close()
    reopened = open_ledger(tmp_path / "node")
    try:
        reopened.verify()  # every block where its locator says, matching its CID
        assert reopened.view().log_size == 40
    finally:
        reopened.close()
