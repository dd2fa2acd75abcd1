"""The bucket filter (ledger/bucketfilter.py): never a false "empty", saved and loaded only when it is exactly
this library's, rebuilt otherwise; and near-duplicates found across restarts and crashes whatever its state."""

from __future__ import annotations

import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from ledger.bucketfilter import _BUILD_CHUNK, FILTER_FILE, BucketFilter
from ledger.ingest import Verdict
from ledger.ledger import Ledger
from ledger.neardup import BAND_KEY_SIZE
from tests import factories

keys = st.binary(min_size=BAND_KEY_SIZE, max_size=BAND_KEY_SIZE)


@settings(max_examples=50, deadline=None)
@given(st.lists(keys, max_size=200), st.lists(keys, max_size=200))
def test_no_false_empty_and_a_rebuild_sets_the_same_bits(tmp_path_factory, added, marked) -> None:
    directory = tmp_path_factory.mktemp("f")
    incremental = BucketFilter(directory, "did:key:z")
    incremental.open(0, iter(()))
    assert incremental.wait_ready(30)
    for key in added + marked:
        incremental.mark(key)
    rebuilt = BucketFilter(directory, "did:key:z")
    assert rebuilt.open(0, iter(added + marked)) == "missing"
    assert rebuilt.wait_ready(30)
    for key in added + marked:
        assert incremental.mark(key) and rebuilt.mark(key)
    rebuilt._adopt()
    assert rebuilt._bits == incremental._bits  # the vectorized rebuild places bits as `add` does


def test_mostly_empty_answers_for_unmarked_buckets(tmp_path: Path) -> None:
    bucket_filter = BucketFilter(tmp_path, "did:key:z")
    bucket_filter.open(0, (i.to_bytes(BAND_KEY_SIZE, "big") for i in range(0, 400_000, 2)))
    assert bucket_filter.wait_ready(60)
    assert all(bucket_filter.mark(i.to_bytes(BAND_KEY_SIZE, "big")) for i in range(0, 400_000, 2))
    maybes = sum(bucket_filter.mark(i.to_bytes(BAND_KEY_SIZE, "big")) for i in range(1, 400_000, 2))
    assert maybes < 200  # 200,000 unmarked buckets: a few false "maybe"s at most


def test_every_bucket_may_be_marked_until_the_rebuild_is_in(tmp_path: Path) -> None:
    release = threading.Event()
    late_mark = b"\xff\x00\x00\x00\x01"

    def marks() -> Iterator[bytes]:
        yield from (i.to_bytes(BAND_KEY_SIZE, "big") for i in range(_BUILD_CHUNK))  # too many to rebuild at once
        release.wait(30)
        yield late_mark

    bucket_filter = BucketFilter(tmp_path, "did:key:z")
    assert bucket_filter.open(0, marks()) == "missing"
    fresh = b"\xfe\x00\x00\x00\x02"
    assert bucket_filter.mark(fresh) and bucket_filter.mark(fresh)  # not known yet: ask the marks
    release.set()
    assert bucket_filter.wait_ready(30)
    assert bucket_filter.mark(late_mark) and bucket_filter.mark(fresh)
    assert not bucket_filter.mark(b"\xfd\x00\x00\x00\x03")
    bucket_filter.close()


def test_a_small_library_saves_no_filter(tmp_path: Path) -> None:
    """Rebuilding a few marks at open costs less than writing, syncing and hashing 16 MiB at every close."""
    small = BucketFilter(tmp_path, "did:key:me")
    assert small.open(5, iter([b"\x00\x00\x00\x00\x07"])) == "missing"
    small.save(5)
    assert not (tmp_path / FILTER_FILE).exists()


def test_saved_filter_is_used_only_when_it_is_exactly_this_librarys(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr("ledger.bucketfilter._BUILD_CHUNK", 4)  # these few marks count as a large library
    marked = [bytes([band]) + b"\x00\x00\x00\x07" for band in range(32)]
    saved = BucketFilter(tmp_path, "did:key:me")
    saved.open(5, iter(marked))
    assert saved.wait_ready(30)
    saved.save(5)
    original = (tmp_path / FILTER_FILE).read_bytes()

    def reopened(generation: int = 5, owner: str = "did:key:me") -> tuple[str, BucketFilter]:
        again = BucketFilter(tmp_path, owner)
        return again.open(generation, iter(marked)), again

    assert reopened()[0] == "loaded"
    assert reopened(6)[0] == "stale (generation 5, library at 6)"
    assert reopened(owner="did:key:other")[0] == "copied from another data directory"
    damaged = bytearray(original)
    damaged[len(damaged) // 2] ^= 1
    (tmp_path / FILTER_FILE).write_bytes(bytes(damaged))
    assert reopened()[0].startswith("damaged")
    (tmp_path / FILTER_FILE).write_bytes(original[:100])
    why, rebuilt = reopened()
    assert why.startswith("damaged") and rebuilt.wait_ready(30)
    assert all(rebuilt.mark(key) for key in marked)


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
    monkeypatch.setattr("ledger.bucketfilter._BUILD_CHUNK", 4)  # rebuild these few marks on the background thread
    params, path = factories.PARAMS, tmp_path / "node"
    pair_a = first_a, duplicate_a = _near_duplicate_pair(0)
    pair_b = first_b, duplicate_b = _near_duplicate_pair(1)
    ledger = Ledger.open(path, params)
    _ingest(ledger, first_a)
    ledger.close()
    shutil.copy(path / FILTER_FILE, tmp_path / "old.filter")  # as saved before the adds below
    ledger = Ledger.open(path, params)
    assert ledger.bucket_filter_status == "loaded"
    _ingest(ledger, first_b)
    ledger.close()
    shutil.copy(tmp_path / "old.filter", path / FILTER_FILE)  # as a crash would leave it
    ledger = Ledger.open(path, params)
    assert ledger.bucket_filter_status.startswith("stale")
    _ingest(ledger, duplicate_b)  # at once: the rebuild may still be running
    assert ledger.library.buckets.wait_ready(30)
    _ingest(ledger, duplicate_a)
    assert _merged(ledger, pair_a) and _merged(ledger, pair_b)
    ledger.close()
    (path / FILTER_FILE).unlink()
    ledger = Ledger.open(path, params)
    assert ledger.bucket_filter_status == "missing"
    assert ledger.library.buckets.wait_ready(30)
    reference = Ledger.open(tmp_path / "reference", params)
    _ingest(reference, first_a, first_b, duplicate_b, duplicate_a)
    assert ledger.view().state_root() == reference.view().state_root()
    reference.close()
    ledger.close()
