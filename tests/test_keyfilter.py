"""The key filter (ledger/keyfilter.py): never a false "absent", saved and loaded only when it is exactly
this ledger's, rebuilt otherwise; and operations and near-duplicates found across restarts and crashes whatever
its state."""

from __future__ import annotations

import hashlib
import logging
import shutil
import struct
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from unittest import mock

from hypothesis import given, settings
from hypothesis import strategies as st

from ledger.ingest import Verdict
from ledger.keyfilter import _BUILD_CHUNK, FILTER_FILE, OLD_FILTER_FILE, TABLES, KeyFilter
from ledger.ledger import Ledger
from ledger.neardup import BAND_KEY_SIZE
from ledger.ops import Kind
from ledger.tables import BLOCK, BUCKET, BUCKET_MARK, BUCKETS_MARKED, LOG, VOTES, bucket_mark_key
from tests import factories

keys = st.builds(lambda table, rest: table + rest, st.sampled_from(TABLES), st.binary(max_size=80))


def _ready_filter(directory: Path, stored: Sequence[bytes] = ()) -> KeyFilter:
    key_filter = KeyFilter(directory, "did:key:z")
    key_filter.open((0, 0), iter(stored))
    assert key_filter.wait_ready(30)
    return key_filter


@settings(max_examples=50, deadline=None)
@given(st.lists(keys, max_size=200), st.lists(keys, max_size=200))
def test_no_false_absent_and_a_rebuild_sets_the_same_bits(tmp_path_factory, added, stored) -> None:
    directory = tmp_path_factory.mktemp("f")
    incremental = _ready_filter(directory)
    for key in added + stored:
        incremental.add(key)
    rebuilt = _ready_filter(directory, added + stored)
    assert all(incremental.may_hold(key) and rebuilt.may_hold(key) for key in added + stored)
    assert (rebuilt._bits == incremental._bits).all()  # the vectorized rebuild places bits as `add` does


@settings(max_examples=50, deadline=None)
@given(st.lists(keys, max_size=100, unique=True), st.lists(keys, min_size=1, max_size=60, unique=True))
def test_many_keys_at_once_are_answered_and_added_as_one_by_one(tmp_path_factory, added, asked) -> None:
    """`add_all` (a new add's 32 bucket marks) sets what `add` sets and answers what `may_hold` answered before."""
    directory = tmp_path_factory.mktemp("f")
    singly, together = _ready_filter(directory), _ready_filter(directory)
    for key in added:
        singly.add(key)
    together.add_all(added)
    assert (together._bits == singly._bits).all() and together._count == singly._count
    before = [singly.may_hold(key) for key in asked]
    for key in asked:
        singly.add(key)
    assert together.add_all(asked) == before
    assert (together._bits == singly._bits).all() and together._count == singly._count
    assert KeyFilter(directory, "did:key:z").add_all(asked) == [True] * len(asked)  # not ready: all maybe


@settings(max_examples=40, deadline=None)
@given(st.lists(keys, max_size=40), st.lists(keys, max_size=80), st.booleans(), st.lists(keys, max_size=20))
def test_a_small_ledgers_exact_keys_become_the_bits_a_rebuild_would_set(
    tmp_path_factory, stored, added, together, never
) -> None:
    """Below `_BUILD_CHUNK` keys the filter holds the keys themselves and answers exactly; once it has that many it
    sets the Bloom filter's bits from them: no key stored is ever "absent", and the bits are a rebuild's."""
    with mock.patch("ledger.keyfilter._BUILD_CHUNK", 50):
        grown = _ready_filter(tmp_path_factory.mktemp("f"), stored)
        if together:
            grown.add_all(added)
        else:
            for key in added:
                grown.add(key)
        every = {*stored, *added}
        assert all(grown.may_hold(key) for key in every)
        if len(every) < 50:
            assert grown._exact == every and not any(grown.may_hold(key) for key in set(never) - every)
        else:
            rebuilt = _ready_filter(tmp_path_factory.mktemp("f"), sorted(every))
            assert grown._exact is None and (grown._bits == rebuilt._bits).all()


def test_mostly_absent_answers_for_keys_never_stored(tmp_path: Path) -> None:
    key_filter = _ready_filter(tmp_path, [BLOCK + i.to_bytes(36, "big") for i in range(0, 400_000, 2)])
    assert all(key_filter.may_hold(BLOCK + i.to_bytes(36, "big")) for i in range(0, 400_000, 2))
    maybes = sum(key_filter.may_hold(BLOCK + i.to_bytes(36, "big")) for i in range(1, 400_000, 2))
    assert maybes < 50  # 200,000 absent keys: a few false "maybe"s at most
    assert key_filter.may_hold(LOG + b"\x00" * 8)  # a table it does not cover: always "maybe"


def test_every_key_may_be_stored_until_the_rebuild_is_in(tmp_path: Path) -> None:
    release = threading.Event()
    late_key = VOTES + b"late"

    def stored() -> Iterator[bytes]:
        yield from (BLOCK + i.to_bytes(36, "big") for i in range(_BUILD_CHUNK))  # too many to rebuild at once
        release.wait(30)
        yield late_key

    key_filter = KeyFilter(tmp_path, "did:key:z")
    assert key_filter.open((0, 0), stored()) == "missing"
    fresh, never = BLOCK + b"fresh", BLOCK + b"never"
    key_filter.add(fresh)
    assert key_filter.may_hold(never) and key_filter.may_hold(late_key)  # not known yet: ask the database
    release.set()
    assert key_filter.wait_ready(30)
    assert key_filter.may_hold(late_key) and key_filter.may_hold(fresh)  # the writer's own bits are kept
    assert not key_filter.may_hold(never)
    key_filter.close()


def test_a_small_ledger_saves_no_filter_and_the_old_bucket_filter_is_removed(tmp_path: Path) -> None:
    """Rebuilding a few keys at open costs less than writing, syncing and hashing 32 MiB at every close."""
    (tmp_path / OLD_FILTER_FILE).write_bytes(b"the bucket filter this one replaced")
    small = KeyFilter(tmp_path, "did:key:me")
    assert small.open((5, 9), iter([BLOCK + b"\x07"])) == "missing"
    small.save((5, 9))
    assert not (tmp_path / FILTER_FILE).exists() and not (tmp_path / OLD_FILTER_FILE).exists()


def _saved_filter(directory: Path, monkeypatch) -> list[bytes]:
    """Save a filter of a few keys of every table at stamp (5, 9), as a large ledger's; returns the keys."""
    monkeypatch.setattr("ledger.keyfilter._BUILD_CHUNK", 4)  # these few keys count as a large ledger
    stored = [table + b"\x00\x07" + bytes([n]) for table in TABLES for n in range(6)]
    saved = KeyFilter(directory, "did:key:me")
    saved.open((5, 9), iter(stored))
    assert saved.wait_ready(30)
    saved.save((5, 9))
    return stored


def test_saved_filter_is_used_only_when_it_is_exactly_this_ledgers(tmp_path: Path, monkeypatch) -> None:
    stored = _saved_filter(tmp_path, monkeypatch)
    original = (tmp_path / FILTER_FILE).read_bytes()

    def reopened(stamp: tuple[int, int] = (5, 9), owner: str = "did:key:me") -> tuple[str, KeyFilter]:
        again = KeyFilter(tmp_path, owner)
        return again.open(stamp, iter(stored)), again

    assert reopened()[0] == "loaded"
    assert reopened((6, 9))[0] == "stale (saved at generation 5 and log size 9, the ledger is at 6 and 9)"
    assert reopened((5, 10))[0].startswith("stale")
    assert reopened(owner="did:key:other")[0] == "copied from another data directory"
    damaged = bytearray(original)
    damaged[len(damaged) // 2] ^= 1
    (tmp_path / FILTER_FILE).write_bytes(bytes(damaged))
    assert reopened()[0].startswith("damaged")
    (tmp_path / FILTER_FILE).write_bytes(original[:100])
    why, rebuilt = reopened()
    assert why.startswith("damaged") and rebuilt.wait_ready(30)
    assert all(rebuilt.may_hold(key) for key in stored)


def test_a_filter_already_on_disk_is_not_written_again(tmp_path: Path, monkeypatch) -> None:
    """A start and stop with nothing written leaves the file alone; a new stamp writes it."""
    stored = _saved_filter(tmp_path, monkeypatch)
    written = (tmp_path / FILTER_FILE).stat()
    again = KeyFilter(tmp_path, "did:key:me")
    assert again.open((5, 9), iter(stored)) == "loaded"
    again.save((5, 9))
    assert (tmp_path / FILTER_FILE).stat().st_ino == written.st_ino  # written files are renamed into place
    again.add(BLOCK + b"\x00\x08")
    again.save((5, 10))
    assert (tmp_path / FILTER_FILE).stat().st_ino != written.st_ino
    assert KeyFilter(tmp_path, "did:key:me").open((5, 10), iter(stored)) == "loaded"


def test_a_file_of_another_format_whose_digest_matches_is_not_trusted(tmp_path: Path) -> None:
    """Another magic with bits of the right size, or this magic with bits of another size."""
    owner = b"did:key:me"
    for magic, bits in ((b"expledger-bucket-filter/2", 1 << 25), (b"expledger-key-filter/1", 1 << 20)):
        body = struct.pack(">32sQQQH", magic, 5, 9, 1, len(owner)) + owner + bytes(bits)
        (tmp_path / FILTER_FILE).write_bytes(hashlib.sha256(body).digest() + body)
        key_filter = KeyFilter(tmp_path, owner.decode())
        assert key_filter.open((5, 9), iter([BLOCK + b"\x07"])) == "another format"
        assert key_filter.wait_ready(30) and key_filter.may_hold(BLOCK + b"\x07")


def test_an_operation_stored_after_the_filter_was_saved_is_not_stored_again(tmp_path: Path, monkeypatch) -> None:
    """A pending operation changes the log but not the library's generation: the stamp must see it."""
    monkeypatch.setattr("ledger.keyfilter._BUILD_CHUNK", 4)  # save the filter of these few keys
    params, path = factories.PARAMS, tmp_path / "node"
    adds = [factories.add(text, factories.author(1)) for text in factories.SEED_TEXTS[:3]]
    missing = factories.add(factories.SEED_TEXTS[3], factories.author(2))
    waiting = factories.signed(
        factories.operation(Kind.VOTE, clock=2, parents=(missing.cid,), target=missing.cid, vote=1), factories.author(3)
    )
    ledger = Ledger.open(path, params)
    _ingest(ledger, *adds)
    ledger.close()
    shutil.copy(path / FILTER_FILE, tmp_path / "old.filter")
    ledger = Ledger.open(path, params)
    assert ledger.key_filter_status == "loaded"
    generation = ledger.view().generation
    _ingest(ledger, waiting)
    assert ledger.pending_count() == 1 and ledger.view().generation == generation
    ledger.close()
    shutil.copy(tmp_path / "old.filter", path / FILTER_FILE)  # as a crash would leave it
    ledger = Ledger.open(path, params)
    assert ledger.key_filter_status.startswith("stale")
    assert ledger.key_filter.wait_ready(30)
    size = ledger.view().log_size
    assert [receipt.verdict for receipt in ledger.ingest([waiting.data])] == [Verdict.IGNORED]
    assert ledger.view().log_size == size
    ledger.close()


def _near_duplicate_pair(number: int) -> tuple:
    text = factories.SEED_TEXTS[number]
    first = factories.add(text, factories.author(1))
    return first, factories.add(text + " ", factories.author(2))  # the same insight, a trailing space apart


def _ingest(ledger: Ledger, *blocks) -> None:
    assert all(receipt.verdict is Verdict.ACCEPTED for receipt in ledger.ingest([block.data for block in blocks]))


def _merged(ledger: Ledger, pair: tuple) -> bool:
    """One of the two near-duplicates absorbed the other (the one that sorts first stays)."""
    live = {record.id for record in ledger.view().experiences() if record.live}
    return len(live & {block.cid for block in pair}) == 1


def test_near_duplicates_are_found_with_a_stale_or_missing_filter(tmp_path: Path, monkeypatch) -> None:
    """A filter saved before a crash is stale: trusting it would miss the buckets marked since."""
    monkeypatch.setattr("ledger.keyfilter._BUILD_CHUNK", 4)  # rebuild these few keys on the background thread
    params, path = factories.PARAMS, tmp_path / "node"
    pair_a = first_a, duplicate_a = _near_duplicate_pair(0)
    pair_b = first_b, duplicate_b = _near_duplicate_pair(1)
    ledger = Ledger.open(path, params)
    _ingest(ledger, first_a)
    ledger.close()
    shutil.copy(path / FILTER_FILE, tmp_path / "old.filter")  # as saved before the adds below
    ledger = Ledger.open(path, params)
    assert ledger.key_filter_status == "loaded"
    _ingest(ledger, first_b)
    ledger.close()
    shutil.copy(tmp_path / "old.filter", path / FILTER_FILE)  # as a crash would leave it
    ledger = Ledger.open(path, params)
    assert ledger.key_filter_status.startswith("stale")
    _ingest(ledger, duplicate_b)  # at once: the rebuild may still be running
    assert ledger.key_filter.wait_ready(30)
    _ingest(ledger, duplicate_a)
    assert _merged(ledger, pair_a) and _merged(ledger, pair_b)
    ledger.close()
    (path / FILTER_FILE).unlink()
    ledger = Ledger.open(path, params)
    assert ledger.key_filter_status == "missing"
    assert ledger.key_filter.wait_ready(30)
    reference = Ledger.open(tmp_path / "reference", params)
    _ingest(reference, first_a, first_b, duplicate_b, duplicate_a)
    assert ledger.view().state_root() == reference.view().state_root()
    reference.close()
    ledger.close()


def test_bucket_marks_a_directory_stored_are_dropped_and_still_answer(tmp_path: Path, monkeypatch, caplog) -> None:
    """A directory from before the marks moved into the filter stored them in table I: they are deleted at open,
    in chunks, and the near-duplicates of its adds are still found."""
    monkeypatch.setattr("ledger.library.upgrades._DROP_CHUNK", 3)
    params, path = factories.PARAMS, tmp_path / "node"
    pair = first, duplicate = _near_duplicate_pair(0)
    ledger = Ledger.open(path, params)
    _ingest(ledger, first, factories.add(factories.SEED_TEXTS[1], factories.author(3)))
    root = ledger.view().state_root()
    bands = {key[1 : 1 + BAND_KEY_SIZE] for key, _ in ledger.store.scan(BUCKET)}
    ledger.store.write({**{bucket_mark_key(band): b"" for band in bands}, BUCKETS_MARKED: b""})  # as it was then
    ledger.close()
    caplog.set_level(logging.INFO, logger="ledger.library")
    ledger = Ledger.open(path, params)
    assert next(ledger.store.scan(BUCKET_MARK), None) is None and ledger.store.get(BUCKETS_MARKED) is None
    assert f"dropped {len(bands)} bucket marks" in caplog.text
    assert ledger.view().state_root() == root
    _ingest(ledger, duplicate)
    assert _merged(ledger, pair)
    ledger.close()
