"""Missing, corrupt or foreign data directories give a clear error at start-up, never an empty ledger."""

import os
import random
import shutil

import plyvel
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ledger import store as store_module
from ledger.blockfile import BLOCKS_DIR, LOCATOR
from ledger.cid import CID
from ledger.errors import LedgerError
from ledger.ledger import Ledger
from ledger.neardup import BAND_KEY_SIZE
from ledger.ops import Kind
from ledger.store import (
    FORMAT,
    FORMAT_BUCKETS_BY_ORDER,
    FORMAT_HEADS_BY_CID,
    Store,
    StoreError,
)
from ledger.tablelinks import TABLE_LINKS, TableLinks
from ledger.tables import ABSORBS, BLOCK, BUCKET, FORMAT_KEY, HEAD, OPMETA, absorbs_key, cid_of_head_key, order_cid, u64
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
    assert ledger.view().log_size == len(BLOCKS)
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


def test_a_deleted_write_ahead_log_is_refused_not_served_empty(node):
    """The node signed a head of size 120; a database that lost its newest entries must not open."""
    for log in _files(node, ".log"):
        os.remove(log)
    error = _open_fails(node, "store.rollback")
    assert "size 120" in error.message and "backup" in error.message


def test_a_deleted_database_is_refused(node):
    shutil.rmtree(node / "ledger.db")
    assert "backup" in _open_fails(node, "store.missing").message


def test_an_older_copy_of_the_database_is_refused(tmp_path):
    path = tmp_path / "node"
    ledger = open_ledger(path)
    ledger.ingest([b.data for b in BLOCKS[:60]])
    ledger.close()
    shutil.copytree(path / "ledger.db", tmp_path / "older")
    ledger = open_ledger(path)
    ledger.ingest([b.data for b in BLOCKS[60:]])
    ledger.close()
    shutil.rmtree(path / "ledger.db")
    shutil.copytree(tmp_path / "older", path / "ledger.db")
    assert "holds 60 log entries" in _open_fails(path, "store.rollback").message


def test_another_nodes_database_of_the_same_size_is_refused(tmp_path):
    ours, theirs = open_ledger(tmp_path / "ours"), open_ledger(tmp_path / "theirs")
    ours.ingest([b.data for b in BLOCKS[:40]])
    theirs.ingest([b.data for b in reversed(BLOCKS[:40])])
    assert ours.view().log_size == theirs.view().log_size and ours.view().merkle.root() != theirs.view().merkle.root()
    ours.close()
    theirs.close()
    shutil.rmtree(tmp_path / "ours" / "ledger.db")
    shutil.copytree(tmp_path / "theirs" / "ledger.db", tmp_path / "ours" / "ledger.db")
    _open_fails(tmp_path / "ours", "store.diverged")


def test_a_damaged_or_foreign_high_water_mark_is_refused(node, tmp_path):
    mark = (node / "tree-head.cbor").read_bytes()
    (node / "tree-head.cbor").write_bytes(mark[:-1])
    _open_fails(node, "store.head")
    other = open_ledger(tmp_path / "other")
    other.ingest([BLOCKS[0].data])
    other.close()
    shutil.copy(tmp_path / "other" / "tree-head.cbor", node / "tree-head.cbor")
    assert "not signed by this node" in _open_fails(node, "store.head").message


def test_the_high_water_mark_covers_every_head_handed_out_and_the_state_at_close(tmp_path):
    from ledger.merkle import TreeHead

    def mark() -> TreeHead:
        return TreeHead.from_bytes((tmp_path / "node" / "tree-head.cbor").read_bytes())

    ledger = open_ledger(tmp_path / "node")
    for count, block in enumerate(BLOCKS[:5], 1):
        ledger.submit(block.data)
        head = ledger.view().tree_head()  # what an RPC client or a peer would be given
        assert (mark().size, mark().root) == (count, head.root) and mark().verify()
    ledger.ingest([b.data for b in BLOCKS[5:10]])
    ledger.close()
    reopened = open_ledger(tmp_path / "node")
    assert mark().size == reopened.view().log_size == 10
    reopened.close()


def test_a_foreign_leveldb_is_refused(tmp_path):
    (tmp_path / "node").mkdir()
    db = plyvel.DB(str(tmp_path / "node" / "ledger.db"), create_if_missing=True)
    db.put(b"hello", b"world")
    db.close()
    _open_fails(tmp_path / "node", "store.format")


def _as_format_1(node, *, drop_meta_of_a_head=False):
    """Rewrite a data directory as format 1 wrote it: heads keyed by CID alone."""
    db = plyvel.DB(str(node / "ledger.db"))
    heads = [cid_of_head_key(key) for key in db.iterator(prefix=HEAD, include_value=False)]
    with db.write_batch(sync=True) as batch:
        for key in db.iterator(prefix=HEAD, include_value=False):
            batch.delete(key)
        for cid in heads:
            batch.put(HEAD + cid, b"")
        batch.put(FORMAT_KEY, FORMAT_HEADS_BY_CID)
        if drop_meta_of_a_head:
            batch.delete(OPMETA + max(heads))  # the last one the upgrade reads: the others are rewritten first
    db.close()


def test_a_format_1_directory_gets_its_heads_ordered_by_clock_once(node):
    before = Ledger.open(node, f.PARAMS)
    heads, parents = before.view().heads(), before.view().parents_and_clock()
    before.close()
    assert len(heads) > 1
    _as_format_1(node)
    migrated = Ledger.open(node, f.PARAMS)
    assert migrated.store.get(FORMAT_KEY) == FORMAT
    assert migrated.view().heads() == heads
    assert migrated.view().parents_and_clock() == parents
    migrated.close()


def test_a_format_1_head_without_metadata_is_refused_and_nothing_is_rewritten(node):
    _as_format_1(node, drop_meta_of_a_head=True)
    db = plyvel.DB(str(node / "ledger.db"))
    before = list(db.iterator(prefix=HEAD))
    db.close()
    _open_fails(node, "store.corrupt")
    db = plyvel.DB(str(node / "ledger.db"))
    assert db.get(FORMAT_KEY) == FORMAT_HEADS_BY_CID and list(db.iterator(prefix=HEAD)) == before
    db.close()


def _as_format_3(node, keep=0):
    """Rewrite a data directory's bucket keys as format 3 wrote them, without anchors, all but the first `keep`
    (an upgrade that was interrupted after rewriting them)."""
    db = plyvel.DB(str(node / "ledger.db"))
    with db.write_batch(sync=True) as batch:
        for key in list(db.iterator(prefix=BUCKET, include_value=False))[keep:]:
            batch.delete(key)
            batch.put(key[: 1 + BAND_KEY_SIZE] + key[9 + BAND_KEY_SIZE :], b"")
        batch.put(FORMAT_KEY, FORMAT_BUCKETS_BY_ORDER)
    db.close()


#: copies of two insights at these clocks, in this arrival order: the last copy of the first is late, and takes over
COPIES = [(f.SEED_TEXTS[0], 4), (f.SEED_TEXTS[0], 6), (f.SEED_TEXTS[1], 5), (f.SEED_TEXTS[1], 7), (f.SEED_TEXTS[0], 2)]


def _copies(node):
    """A data directory holding COPIES (arriving in that order); returns their blocks."""
    adds = [
        f.signed(f.operation(Kind.ADD, clock=clock, content=f.content(text)), f.author(number))
        for number, (text, clock) in enumerate(COPIES, 1)
    ]
    ledger = open_ledger(node)
    for block in adds:
        ledger.submit(block.data)
    ledger.close()
    return adds


@pytest.mark.parametrize("keep", [0, 40], ids=["whole", "resumed"])
def test_a_format_3_directory_gets_its_buckets_anchored_once(tmp_path, keep):
    node = tmp_path / "node"
    adds = _copies(node)
    _as_format_3(node, keep)
    migrated = Ledger.open(node, f.PARAMS)
    assert migrated.store.get(FORMAT_KEY) == FORMAT
    keys = migrated.store.keys(BUCKET)
    assert len(keys) == 32 * len(adds)
    view = migrated.view()
    for key in keys[keep:]:  # an absorbed add's anchor is its F's clock now (two were taken over), else its own
        anchor, order = key[1 + BAND_KEY_SIZE : 9 + BAND_KEY_SIZE], key[9 + BAND_KEY_SIZE :]
        into = migrated.store.get(absorbs_key(order_cid(order)))
        assert anchor == (order[:8] if into is None else u64(view.clock(CID(into))))
    late = f.signed(f.operation(Kind.ADD, clock=1, content=f.content(f.SEED_TEXTS[1])), f.author(9))
    assert migrated.submit(late.data).outcome == "applied"  # and it takes over the copies at 5 and 7
    at_once = open_ledger(tmp_path / "at_once")
    at_once.ingest([block.data for block in [*adds, late]])
    assert migrated.view().snapshot() == at_once.view().snapshot()
    migrated.close()
    at_once.close()


def test_a_format_3_add_absorbed_into_one_without_metadata_is_refused_and_nothing_is_rewritten(tmp_path):
    node = tmp_path / "node"
    _copies(node)
    _as_format_3(node)
    db = plyvel.DB(str(node / "ledger.db"))
    into = next(db.iterator(prefix=ABSORBS, include_key=False))
    db.delete(OPMETA + into, sync=True)
    before = list(db.iterator(prefix=BUCKET))
    db.close()
    error = _open_fails(node, "store.corrupt")
    assert into.hex() in error.message
    db = plyvel.DB(str(node / "ledger.db"))
    assert db.get(FORMAT_KEY) == FORMAT_BUCKETS_BY_ORDER and list(db.iterator(prefix=BUCKET)) == before
    db.close()


def test_a_missing_node_key_is_refused(node):
    os.remove(node / "node.key")
    assert _open_fails(node, "keyfile.io").message.startswith("node key")


def test_verify_finds_a_single_damaged_block(node):
    ledger = open_ledger(node)
    victim = BLOCKS[50].cid
    segment, offset, length = LOCATOR.unpack(ledger.store.get(BLOCK + victim.raw))
    ledger.close()
    path = node / "ledger.db" / BLOCKS_DIR / f"{segment:05d}.blk"
    data = bytearray(path.read_bytes())
    data[offset + length // 2] ^= 0x01
    path.write_bytes(bytes(data))
    ledger = open_ledger(node)
    with pytest.raises(StoreError) as caught:
        ledger.verify()
    assert caught.value.code == "store.corrupt" and str(victim) in caught.value.message
    assert ledger.view().has(BLOCKS[49].cid) and ledger.view().block(BLOCKS[49].cid) is not None
    with pytest.raises(StoreError, match="does not match its CID"):
        ledger.view().block(victim)
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
    assert ledger.node_key.did == key.did and ledger.view().log_size == 0
    ledger.close()


def test_a_database_created_but_never_written_is_initialised(tmp_path):
    node = tmp_path / "node"
    ledger = open_ledger(node)
    ledger.close()
    os.remove(node / "index.usearch")
    shutil.rmtree(node / "ledger.db")
    plyvel.DB(str(node / "ledger.db"), create_if_missing=True).close()  # died before writing the format
    ledger = open_ledger(node)
    assert ledger.view().log_size == 0
    ledger.close()


def test_a_data_directory_belongs_to_one_network(node):
    from dataclasses import replace

    with pytest.raises(StoreError) as caught:
        Ledger.open(node, replace(f.PARAMS, text_max=64))
    assert caught.value.code == "store.network" and "text_max 32 (asked 64)" in caught.value.message
    ledger = Ledger.open(node, f.PARAMS)
    assert ledger.view().log_size == len({b.cid for b in BLOCKS})
    ledger.close()


def test_a_data_directory_in_use_is_refused(node):
    first = Ledger.open(node, f.PARAMS)
    with pytest.raises(StoreError) as caught:
        Ledger.open(node, f.PARAMS)
    assert caught.value.code == "store.open" and "lock" in caught.value.message.lower()
    first.close()


def _tables(database):
    return {name for name in os.listdir(database) if name.endswith(".ldb")}


def _churn(db, round_):
    """Rewrite the same keys and compact: LevelDB replaces tables and deletes the old ones."""
    with db.write_batch() as batch:
        for key in range(2000):
            batch.put(key.to_bytes(4, "big"), bytes([round_]) * 200)
    db.compact_range(start=b"\x00", stop=b"\xff")


def test_every_table_gets_a_second_link_that_goes_when_leveldb_deletes_the_table(tmp_path):
    database = tmp_path / "db"
    db = plyvel.DB(str(database), create_if_missing=True, write_buffer_size=64 * 1024)
    links = TableLinks(database, interval=3600)  # passes only when the test asks
    seen: set[str] = set()
    linked: set[str] = set()
    for round_ in range(4):
        _churn(db, round_)
        deleted = linked - _tables(database)
        assert deleted <= set(os.listdir(database / TABLE_LINKS)), "LevelDB's deletes left the second links"
        links.sweep()
        assert set(os.listdir(database / TABLE_LINKS)) == _tables(database)
        for name in _tables(database):  # the same file, not a copy
            assert os.path.samefile(database / name, database / TABLE_LINKS / name)
            assert os.stat(database / name).st_nlink == 2
        linked = _tables(database)
        seen |= linked
    assert seen - _tables(database), "the compactions replaced tables"
    assert db.get((7).to_bytes(4, "big")) == bytes([3]) * 200
    db.close()
    links.close()


def test_close_frees_the_links_of_deleted_tables_and_leveldb_ignores_the_links_directory(tmp_path):
    database = tmp_path / "db"
    store = Store(database, create=True)
    store.write({f"k{key}".encode(): os.urandom(100) for key in range(5000)})
    store._db.compact_range(start=b"\x00", stop=b"\xff")
    store._links.sweep()
    first = set(os.listdir(database / TABLE_LINKS))
    store.write({f"k{key}".encode(): os.urandom(100) for key in range(5000)})
    store._db.compact_range(start=b"\x00", stop=b"\xff")
    store.close()
    assert first and first - _tables(database), "the second compaction replaced the first tables"
    assert set(os.listdir(database / TABLE_LINKS)) <= _tables(database)
    reopened = Store(database, create=False)
    assert len(list(reopened.scan(b"k"))) == 5000
    reopened.close()


def test_links_left_by_a_crash_are_freed_at_open(node):
    stale = node / "ledger.db" / TABLE_LINKS / "999999.ldb"
    stale.write_bytes(b"a table LevelDB deleted while the node was down")
    ledger = Ledger.open(node, f.PARAMS)
    assert not stale.exists()
    ledger.store._links.sweep()  # the copy's links are copies: freed, and the tables linked again
    assert set(os.listdir(node / "ledger.db" / TABLE_LINKS)) == _tables(node / "ledger.db")
    for name in _tables(node / "ledger.db"):
        assert os.path.samefile(node / "ledger.db" / name, node / "ledger.db" / TABLE_LINKS / name)
    ledger.close()


def test_without_hard_links_the_database_still_works(tmp_path, monkeypatch, caplog):
    def refuse(source, target):
        raise PermissionError(1, "Operation not permitted", str(target))

    monkeypatch.setattr(os, "link", refuse)
    store = Store(tmp_path / "db", create=True)
    store.write({b"Mkey": b"value"})
    store._db.compact_range(start=b"\x00", stop=b"\xff")
    store._links.sweep()  # what the thread does every 0.1 s
    assert store.get(b"Mkey") == b"value"
    store.close()
    assert "cannot hard-link LevelDB tables" in caplog.text


def test_losing_the_links_directory_stops_the_links_not_the_database(tmp_path, caplog):
    store = Store(tmp_path / "db", create=True)
    shutil.rmtree(tmp_path / "db" / TABLE_LINKS)
    store._links._thread.join(30)  # its next pass fails, and it stops
    assert not store._links._thread.is_alive()
    assert "LevelDB deletes tables the slow way from now on" in caplog.text
    store.write({b"Mkey": b"value"})
    assert store.get(b"Mkey") == b"value"
    store.close()


def test_a_write_that_fails_midway_writes_nothing(tmp_path):
    store = Store(tmp_path / "ledger.db", create=True)
    with pytest.raises(TypeError):
        store.write({b"Ma": b"1", b"Mb": "not bytes"})  # type: ignore[dict-item]
    assert store.get(b"Ma") is None
    store.close()


#: keys of three buckets, two of which share all but their last byte
_BANDS = (b"\x00" * BAND_KEY_SIZE, b"\x00" * (BAND_KEY_SIZE - 1) + b"\x01", b"\x01" * BAND_KEY_SIZE)
_SUFFIXES = st.tuples(st.sampled_from(_BANDS), st.binary(min_size=0, max_size=3)).map(b"".join)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    stored=st.sets(_SUFFIXES, max_size=30),
    written=st.dictionaries(_SUFFIXES, st.booleans(), max_size=15),
    prefix=st.tuples(st.sampled_from(_BANDS), st.binary(max_size=1)).map(b"".join),
    start=st.none() | st.binary(min_size=0, max_size=3),
)
def test_a_transactions_keys_are_the_keys_of_its_scan(tmp_path_factory, stored, written, prefix, start):
    """`scan` yields the stored keys of one bucket, this transaction's puts, less its deletes, in order (a
    transaction keeps each bucket's writes sorted apart); `keys` lists the same in one step, `items` with the
    values (a write replaces the stored value), putting few writes in place or merging many."""
    store = Store(tmp_path_factory.mktemp("db") / "db", create=True)
    store.write({BUCKET + suffix: b"v" for suffix in stored})
    txn = store.transaction()
    for suffix, put in written.items():
        txn.put(BUCKET + suffix, b"w" if put else None)
    low = BUCKET + prefix + start if start is not None else None
    present = (stored - {s for s, put in written.items() if not put}) | {s for s, put in written.items() if put}
    expected = sorted(BUCKET + s for s in present if s.startswith(prefix) and (low is None or BUCKET + s >= low))
    assert [key for key, _ in txn.scan(BUCKET + prefix, low)] == expected
    assert txn.keys(BUCKET + prefix, low) == expected
    values = {BUCKET + s: b"w" if s in written else b"v" for s in present}
    assert txn.items(BUCKET + prefix, low) == list(txn.scan(BUCKET + prefix, low)) == [(k, values[k]) for k in expected]
    with pytest.MonkeyPatch.context() as patch:  # many writes: merged by `scan`
        patch.setattr(store_module, "_FEW_WRITES", 0)
        assert txn.items(BUCKET + prefix, low) == [(k, values[k]) for k in expected]
    with pytest.raises(ValueError, match="groups"):
        txn.keys(BUCKET + prefix[: BAND_KEY_SIZE - 1])
    assert store.keys(BUCKET + prefix, low) == [key for key, _ in store.scan(BUCKET + prefix, low)]
    store.close()
