"""Operation bytes in block files: the database never names a byte that is not on disk, and a format 2 directory
moves its blocks there once, resuming if interrupted."""

import os
import random

import plyvel
import pytest

import ledger.blockfile as blockfile
import ledger.store as store_module
from ledger.blockfile import BLOCKS_DIR, LOCATOR
from ledger.store import FORMAT, FORMAT_BLOCKS_IN_TABLE, StoreError
from ledger.tables import BLOCK, BLOCKS_END, FORMAT_KEY
from tests.ledgers import open_ledger, random_history

BLOCKS = random_history(random.Random(12), 160)


def _segments(node):
    directory = node / "ledger.db" / BLOCKS_DIR
    return sorted(directory / name for name in os.listdir(directory))


def _everything_readable(node, blocks):
    ledger = open_ledger(node)
    try:
        assert ledger.view().log_size == len(blocks)
        for block in blocks:
            assert ledger.view().block(block.cid).data == block.data
        ledger.verify()
        return ledger.view().snapshot()
    finally:
        ledger.close()


def test_blocks_live_in_segment_files_and_the_table_holds_locators(tmp_path, monkeypatch):
    monkeypatch.setattr(blockfile, "SEGMENT_BYTES", 20_000)  # several segments
    node = tmp_path / "node"
    ledger = open_ledger(node)
    for start in range(0, len(BLOCKS), 40):
        ledger.ingest([b.data for b in BLOCKS[start : start + 40]])
    locators = {b.cid.raw: ledger.store.get(BLOCK + b.cid.raw) for b in BLOCKS}
    ledger.close()
    assert all(len(locator) == LOCATOR.size for locator in locators.values())
    segments = _segments(node)
    assert len(segments) > 3 and all(path.stat().st_size <= 20_000 for path in segments)
    assert all(path.stat().st_mode & 0o077 == 0 for path in segments)
    assert sum(path.stat().st_size for path in segments) == sum(len(b.data) for b in BLOCKS)
    _everything_readable(node, BLOCKS)


def test_bytes_a_crash_left_past_the_recorded_end_are_cut_away(tmp_path, monkeypatch):
    """The blocks are synced before the database write that names them: a crash in between leaves them past the end."""
    node = tmp_path / "node"
    ledger = open_ledger(node)
    ledger.ingest([b.data for b in BLOCKS[:80]])
    failing = store_module.Store._apply

    def crash(self, puts, pause=None):
        raise OSError("the process died before the database write")

    monkeypatch.setattr(store_module.Store, "_apply", crash)
    with pytest.raises(OSError):
        ledger.ingest([b.data for b in BLOCKS[80:120]])
    monkeypatch.setattr(store_module.Store, "_apply", failing)
    segment = _segments(node)[-1]
    written = segment.stat().st_size
    ledger.ingest([b.data for b in BLOCKS[80:100]])  # the next batch writes where the failed one did
    ledger.close()
    assert segment.stat().st_size <= written
    snapshot = _everything_readable(node, BLOCKS[:100])
    with segment.open("ab") as tail:  # a crash after the files were synced, before the database was
        tail.write(b"x" * 5000)
    assert _everything_readable(node, BLOCKS[:100]) == snapshot
    assert segment.stat().st_size == sum(len(b.data) for b in BLOCKS[:100])


@pytest.mark.parametrize("damage", ["truncated", "missing"])
def test_block_files_short_of_what_the_database_names_are_refused(tmp_path, damage):
    node = tmp_path / "node"
    ledger = open_ledger(node)
    ledger.ingest([b.data for b in BLOCKS])
    ledger.close()
    segment = _segments(node)[-1]
    if damage == "truncated":
        os.truncate(segment, segment.stat().st_size - 1)
    else:
        segment.unlink()
    with pytest.raises(StoreError) as caught:
        open_ledger(node)
    assert caught.value.code == "store.corrupt" and segment.name in caught.value.message


def _as_format_2(node):
    """Rewrite a directory as format 2 wrote it: bytes in the B table, no recorded end (a stray block file, as
    an upgrade that died before its first write leaves one)."""
    ledger = open_ledger(node)
    data = {BLOCK + cid: ledger.store.block(cid) for cid in (b.cid.raw for b in BLOCKS)}
    ledger.close()
    db = plyvel.DB(str(node / "ledger.db"))
    with db.write_batch(transaction=True) as batch:
        for key, value in data.items():
            batch.put(key, value)
        batch.put(FORMAT_KEY, FORMAT_BLOCKS_IN_TABLE)
        batch.delete(BLOCKS_END)
    db.close()
    for path in _segments(node):
        path.write_bytes(b"stray bytes of an upgrade that never recorded its end")


def _format_2_node(tmp_path):
    """A node holding `BLOCKS`, rewritten as format 2; returns its directory and its library snapshot."""
    node = tmp_path / "node"
    ledger = open_ledger(node)
    ledger.ingest([b.data for b in BLOCKS])
    snapshot = ledger.view().snapshot()
    ledger.close()
    _as_format_2(node)
    return node, snapshot


def test_a_format_2_directory_moves_its_blocks_into_files_once(tmp_path, monkeypatch):
    node, snapshot = _format_2_node(tmp_path)
    monkeypatch.setattr(store_module, "_UPGRADE_CHUNK", 25)  # several synced chunks
    assert _everything_readable(node, BLOCKS) == snapshot
    db = plyvel.DB(str(node / "ledger.db"))
    assert db.get(FORMAT_KEY) == FORMAT
    assert all(len(value) == LOCATOR.size for _, value in db.iterator(prefix=BLOCK))
    db.close()
    assert sum(path.stat().st_size for path in _segments(node)) == sum(len(b.data) for b in BLOCKS)


def test_an_interrupted_upgrade_resumes(tmp_path, monkeypatch):
    """A crash between two chunks of the upgrade: the chunks moved stay moved, the rest move at the next start."""
    node, snapshot = _format_2_node(tmp_path)
    monkeypatch.setattr(store_module, "_UPGRADE_CHUNK", 30)
    chunks = []
    original = store_module.Store._move_chunk

    def die_after_two(self, chunk, *, final):
        if len(chunks) == 2:
            raise OSError("killed during the upgrade")
        chunks.append(len(chunk))
        return original(self, chunk, final=final)

    monkeypatch.setattr(store_module.Store, "_move_chunk", die_after_two)
    with pytest.raises(StoreError, match="killed during the upgrade") as caught:
        open_ledger(node)
    assert caught.value.code == "store.write"
    monkeypatch.setattr(store_module.Store, "_move_chunk", original)
    db = plyvel.DB(str(node / "ledger.db"))
    assert db.get(FORMAT_KEY) == FORMAT_BLOCKS_IN_TABLE
    assert sum(len(value) == LOCATOR.size for _, value in db.iterator(prefix=BLOCK)) == 60
    db.close()
    assert _everything_readable(node, BLOCKS) == snapshot


def test_a_damaged_locator_is_an_error_not_a_crash(tmp_path):
    node = tmp_path / "node"
    ledger = open_ledger(node)
    ledger.ingest([b.data for b in BLOCKS[:10]])
    ledger.store.write({BLOCK + BLOCKS[3].cid.raw: b"\x00" * 7})
    with pytest.raises(StoreError, match="locator is damaged") as caught:
        ledger.store.block(BLOCKS[3].cid.raw)
    assert caught.value.code == "store.corrupt"
    assert ledger.store.block(BLOCKS[4].cid.raw) == BLOCKS[4].data
    ledger.close()


def test_a_data_directory_with_block_files_from_another_database_is_refused(tmp_path):
    """Block files copied from another node's directory hold other bytes: reads fail their CID check."""
    first, second = tmp_path / "first", tmp_path / "second"
    for node, blocks in ((first, BLOCKS[:60]), (second, BLOCKS[60:120])):
        ledger = open_ledger(node)
        ledger.ingest([b.data for b in blocks])
        ledger.close()
    for source, target in zip(_segments(second), _segments(first), strict=False):
        target.write_bytes(source.read_bytes())
    with pytest.raises(StoreError) as caught:
        open_ledger(first)  # start-up checks the newest log entries' blocks
    assert caught.value.code == "store.corrupt"
