"""Missing, corrupt or foreign data directories give a clear error at start-up, never an empty ledger."""

import os
import random
import shutil

import plyvel
import pytest

from ledger.errors import LedgerError
from ledger.ledger import Ledger
from ledger.store import BLOCK, StoreError
from tests import factories as f
from tests.ledgers import open_ledger, random_history

BLOCKS = random_history(random.Random(11), 120)


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    """A data directory with a compacted table file and a fresh write-ahead log."""
    path = tmp_path_factory.mktemp("template") / "node"
    ledger = open_ledger(path)
    ledger.ingest([b.data for b in BLOCKS[:100]])
    ledger.store._db.compact_range()
    ledger.ingest([b.data for b in BLOCKS[100:]])
    ledger.close()
    return path


@pytest.fixture
def node(template, tmp_path):
    copy = tmp_path / "node"
    shutil.copytree(template, copy)
    return copy


def _files(node, suffix):
    return [node / "ledger.db" / name for name in os.listdir(node / "ledger.db") if name.endswith(suffix)]


def _garble(path, every=4096):
    data = bytearray(path.read_bytes())
    for start in range(min(64, len(data) // 2), len(data), every):
        for i in range(start, min(start + 16, len(data))):
            data[i] ^= 0x5A
    path.write_bytes(bytes(data))


def _open_fails(node, code):
    with pytest.raises(StoreError) as caught:
        Ledger.open(node, f.PARAMS)
    assert caught.value.code == code
    return caught.value


def test_an_intact_directory_reopens_with_everything(node):
    ledger = open_ledger(node)
    assert ledger.log_size == len(BLOCKS)
    ledger.verify()
    ledger.close()


def test_missing_current_file(node):
    os.remove(node / "ledger.db" / "CURRENT")
    assert "refusing to start with an empty ledger" in _open_fails(node, "store.missing").message


def test_missing_database_directory(node):
    shutil.rmtree(node / "ledger.db")
    _open_fails(node, "store.missing")


def test_damaged_manifest(node):
    for manifest in (node / "ledger.db").glob("MANIFEST-*"):
        _garble(manifest, every=64)
    _open_fails(node, "store.corrupt")


def test_damaged_table_file(node):
    for table in _files(node, ".ldb"):
        _garble(table)
    _open_fails(node, "store.corrupt")


def test_truncated_table_file(node):
    for table in _files(node, ".ldb"):
        table.write_bytes(table.read_bytes()[:200])
    _open_fails(node, "store.corrupt")


def test_damaged_write_ahead_log(node):
    logs = [log for log in _files(node, ".log") if log.stat().st_size > 1000]
    assert logs
    for log in logs:
        _garble(log, every=512)
    _open_fails(node, "store.corrupt")


def test_a_foreign_leveldb_is_refused(tmp_path):
    (tmp_path / "node").mkdir()
    db = plyvel.DB(str(tmp_path / "node" / "ledger.db"), create_if_missing=True)
    db.put(b"hello", b"world")
    db.close()
    _open_fails(tmp_path / "node", "store.format")


def test_a_missing_node_key_is_refused(node):
    os.remove(node / "node.key")
    assert _open_fails(node, "keyfile.io").message.startswith("node key")


def test_verify_finds_a_single_damaged_block(node):
    ledger = open_ledger(node)
    victim = BLOCKS[50].cid
    ledger.store.write({BLOCK + victim.raw: BLOCKS[51].data})
    with pytest.raises(StoreError) as caught:
        ledger.verify()
    assert str(victim) in caught.value.message
    ledger.close()


def test_key_file_and_directory_are_private(tmp_path):
    ledger = open_ledger(tmp_path / "fresh")
    assert (tmp_path / "fresh").stat().st_mode & 0o077 == 0
    assert (tmp_path / "fresh" / "node.key").stat().st_mode & 0o077 == 0
    ledger.close()


def test_store_errors_belong_to_the_error_family():
    assert issubclass(StoreError, LedgerError)


def test_an_interrupted_creation_is_finished_with_the_key_it_made(tmp_path):
    node = tmp_path / "node"
    node.mkdir()
    from ledger.keys import AuthorKey

    key = AuthorKey.generate()
    key.save(node / "node.key")  # the start died right after writing the key
    ledger = open_ledger(node)
    assert ledger.node_key.did == key.did and ledger.log_size == 0
    ledger.close()


def test_a_database_created_but_never_written_is_initialised(tmp_path):
    node = tmp_path / "node"
    ledger = open_ledger(node)
    ledger.close()
    os.remove(node / "index.usearch")
    shutil.rmtree(node / "ledger.db")
    plyvel.DB(str(node / "ledger.db"), create_if_missing=True).close()  # died before writing the format
    ledger = open_ledger(node)
    assert ledger.log_size == 0
    ledger.close()


def test_a_data_directory_belongs_to_one_network(node):
    from dataclasses import replace

    with pytest.raises(StoreError) as caught:
        Ledger.open(node, replace(f.PARAMS, text_max=64))
    assert caught.value.code == "store.network" and "text_max 32 (asked 64)" in caught.value.message
    ledger = Ledger.open(node, f.PARAMS)
    assert ledger.log_size == len({b.cid for b in BLOCKS})
    ledger.close()


def test_a_data_directory_in_use_is_refused(node):
    first = Ledger.open(node, f.PARAMS)
    with pytest.raises(StoreError) as caught:
        Ledger.open(node, f.PARAMS)
    assert caught.value.code == "store.open" and "lock" in caught.value.message.lower()
    first.close()
