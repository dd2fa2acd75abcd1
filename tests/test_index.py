"""The vector index holds exactly the live experiences: after random histories, rebuilds, restarts and damaged files."""

import json
import logging
import random
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ledger import codec
from ledger.cid import CID
from ledger.embedder import unpack_float16
from ledger.index import INDEX_FILE, META_FILE, hnsw
from ledger.ops import Kind
from tests import factories as f
from tests.ledgers import CONTEXTS, open_ledger, random_history

ROOT = Path(__file__).resolve().parent.parent


def _live(ledger) -> set[bytes]:
    return {cid.raw for cid in ledger.view().live_ids()}


def _assert_index_matches_library(ledger) -> None:
    """Indexed ids are the live experiences, each with the vector of its visible version."""
    view, indexed = ledger.view(), ledger.indexed()
    assert set(indexed) == _live(ledger)
    for exp_id, version in indexed.items():
        assert version == view.experience(CID(exp_id)).version.raw


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1), size=st.integers(1, 40))
def test_search_right_after_a_batch_covers_what_the_index_thread_has_not_inserted(tmp_path_factory, seed, size):
    """The index thread inserts behind the writer: a search right after `ingest` returns must still see exactly
    the live experiences, each scored by the vector of its visible version, whatever the thread has done."""
    rng = random.Random(seed)
    blocks = random_history(rng, size)
    rng.shuffle(blocks)
    ledger = open_ledger(tmp_path_factory.mktemp("node"))
    for start in range(0, len(blocks), 3):
        ledger.ingest([b.data for b in blocks[start : start + 3]])
        view, live = ledger.view(), _live(ledger)
        vectors = {
            exp_id: unpack_float16(view.content(view.experience(CID(exp_id)).version).embedding.values)
            for exp_id in live
        }
        query = next(iter(vectors.values()), np.ones(ledger.params.embedding_dim, dtype=np.float32))
        found = ledger.nearest(query, len(live) + 3)
        assert {cid.raw for cid, _ in found} == live
        for cid, score in found:
            vector = vectors[cid.raw]
            expected = float(vector @ query / (np.linalg.norm(vector) * np.linalg.norm(query)))
            assert score == pytest.approx(expected, abs=2e-3)
        best = ledger.nearest(query, 1)
        # the backlog is scored as exact search scores the index: the same answer wherever the vectors are
        assert best == found[:1]
        assert ledger.nearest(query, 0) == []
        assert ledger.live_count() == len(live)
    ledger.close()


@pytest.mark.parametrize("graph", [False, True], ids=["exact", "hnsw"])
@pytest.mark.parametrize("seed", [0, 1, 4, 5])  # histories that change an indexed experience while queued
def test_a_backlog_the_index_has_not_taken_in_is_searched_exactly(tmp_path, graph, seed):
    """Batches stay queued until the index takes them in (here on the test's thread, after a random few): a search
    leaves out what the index holds for an experience with a queued change, in exact search and in the graph
    alike, and scores the queued vectors, which are kept as batches are queued and taken in."""
    rng = random.Random(seed)
    blocks = random_history(rng, 120)
    rng.shuffle(blocks)
    ledger = open_ledger(tmp_path / "node")
    if graph:
        ledger._index._exact_limit, ledger._index._exact = 0, None
    ledger._feeding = True  # the writer starts no index thread

    def check() -> None:
        view, live = ledger.view(), _live(ledger)
        vectors = {
            exp_id: unpack_float16(view.content(view.experience(CID(exp_id)).version).embedding.values)
            for exp_id in live
        }
        queued = {exp_id for exp_id, change in ledger._unindexed.items() if change is not None}
        assert set(ledger._queued_rows.ids()) == queued
        query = np.ones(ledger.params.embedding_dim, dtype=np.float32)
        found = ledger.nearest(query, len(live) + 3)
        assert sorted(cid.raw for cid, _ in found) == sorted(live)
        for cid, score in found:
            vector = vectors[cid.raw]
            expected = float(vector @ query / (np.linalg.norm(vector) * np.linalg.norm(query)))
            assert score == pytest.approx(expected, abs=2e-3)
        assert ledger.nearest(query, 1) == found[:1]

    stale = 0  # searches made while the index held an experience whose change was queued
    for start in range(0, len(blocks), 5):
        ledger.ingest([b.data for b in blocks[start : start + 5]])
        stale += any(exp_id in ledger._index for exp_id in ledger._unindexed)
        check()
        if rng.random() < 0.5:
            ledger._feed()  # the index thread's work, until the backlog is empty
            ledger._feeding = True
            assert not ledger._unindexed and not len(ledger._queued_rows)
            check()
    assert stale, "no search had to leave out a stale entry of the index"
    ledger._feed()
    ledger.close()


@pytest.mark.parametrize("graph", [False, True], ids=["exact", "hnsw"])
def test_an_experience_changed_again_while_queued_is_scored_once_by_its_latest_vector(tmp_path, graph):
    """An indexed experience modified twice, and another deleted, while their batches wait for the index: a search
    answers each live experience once, with the vector of its latest version, and none that is gone."""
    ledger = open_ledger(tmp_path / "node")
    if graph:
        ledger._index._exact_limit, ledger._index._exact = 0, None
    ledger._feeding = True  # the writer starts no index thread; the test takes the backlog in
    texts = [f"When {context}, check the boundary cases separately." for context in CONTEXTS[:4]]
    adds = [f.signed(f.operation(Kind.ADD, content=f.content(text)), f.author(1)) for text in texts]
    ledger.ingest([block.data for block in adds])
    ledger._feed()
    ledger._feeding = True
    target, gone = adds[0].cid, adds[1].cid
    edits = [f"When {CONTEXTS[5]}, {action}." for action in ("draw the configuration first", "try small cases")]
    first = f.signed(f.operation(Kind.MODIFY, clock=2, parents=(target,), target=target, content=f.content(edits[0])))
    ledger.ingest([first.data])
    second = f.signed(
        f.operation(Kind.MODIFY, clock=3, parents=(first.cid,), target=target, content=f.content(edits[1]))
    )
    delete = f.signed(f.operation(Kind.DELETE, clock=2, parents=(gone,), target=gone, reason="proven incorrect"))
    ledger.ingest([second.data, delete.data])
    assert ledger._backlog and ledger.view().experience(target).version == second.cid
    query = unpack_float16(f.content(edits[1]).embedding.values)
    found = ledger.nearest(query, 10)
    assert [cid for cid, _ in found].count(target) == 1 and gone not in [cid for cid, _ in found]
    assert found[0][0] == target and found[0][1] == pytest.approx(1.0, abs=1e-3)
    assert len(found) == 3 and sorted(ledger._queued_rows.ids()) == [target.raw]
    ledger._feed()  # the graph scores its int8 vectors: the same experiences, nearly the same scores
    assert {cid for cid, _ in ledger.nearest(query, 10)} == {cid for cid, _ in found}
    ledger.close()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1), size=st.integers(1, 40), actions=st.text("LICN", max_size=10))
def test_index_equals_live_experiences_through_rebuilds_restarts_and_lost_files(
    tmp_path_factory, caplog, seed, size, actions
):
    """`actions` says what follows each batch: L rebuild the library, I rebuild the index, C check the index,
    N nothing."""
    caplog.clear()
    rng = random.Random(seed)
    blocks = random_history(rng, size)
    rng.shuffle(blocks)
    path = tmp_path_factory.mktemp("node")
    ledger = open_ledger(path)
    for batch, start in enumerate(range(0, len(blocks), 4)):
        ledger.ingest([b.data for b in blocks[start : start + 4]])
        action = actions[batch] if batch < len(actions) else "C"
        if action == "L":
            ledger.rebuild_library()
        elif action == "I":
            ledger.rebuild_index()
        elif action == "C":
            _assert_index_matches_library(ledger)
    _assert_index_matches_library(ledger)
    live = _live(ledger)
    ledger.close()

    ledger = open_ledger(path)  # saved index, reloaded
    assert ledger.index_status == "loaded"
    _assert_index_matches_library(ledger)
    ledger.close()

    (path / INDEX_FILE).unlink()  # lost index: rebuilt
    ledger = open_ledger(path)
    assert ledger.index_status == "missing" and set(ledger.indexed()) == live
    ledger.close()
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], "an index update failed and was rebuilt"


def test_an_index_already_on_disk_is_not_written_again(tmp_path) -> None:
    """Closing after a start with nothing new leaves the files alone (at 1M operations writing them took ~1 s);
    a change writes them, and they load."""
    path = tmp_path / "node"
    ledger = open_ledger(path)
    ledger.ingest([f.add(text, f.author(n)).data for n, text in enumerate(f.SEED_TEXTS[:3])])
    ledger.close()
    written = {name: (path / name).stat().st_ino for name in (INDEX_FILE, META_FILE)}
    ledger = open_ledger(path)
    assert ledger.index_status == "loaded"
    ledger.close()
    assert {name: (path / name).stat().st_ino for name in written} == written  # saves rename new files in
    ledger = open_ledger(path)
    ledger.ingest([f.add(f.SEED_TEXTS[3], f.author(9)).data])
    live = _live(ledger)
    ledger.close()
    assert all((path / name).stat().st_ino != inode for name, inode in written.items())
    ledger = open_ledger(path)
    assert ledger.index_status == "loaded" and set(ledger.indexed()) == live
    ledger.close()


def _merge_and_late_delete() -> tuple:
    a, b = f.add(f.SEED_TEXTS[0], f.author(1)), f.add(f.SEED_TEXTS[1], f.author(2))
    targets = tuple(sorted((a.cid, b.cid)))
    merge = f.signed(
        f.operation(Kind.MERGE, 2, targets, targets=targets, content=f.content(f.SEED_TEXTS[2]), reason="same"),
        f.author(3),
    )
    # concurrent with the merge (does not descend from it): once applied, it voids the merge
    delete = f.signed(f.operation(Kind.DELETE, 2, (a.cid,), target=a.cid, reason="proven incorrect"), f.author(1))
    return a, b, merge, delete


@pytest.mark.parametrize("indexed_first", ["B", "A and B"])
def test_a_late_delete_after_a_library_rebuild_brings_the_merge_source_back_into_the_index(
    tmp_path, caplog, indexed_first
):
    a, b, merge, delete = _merge_and_late_delete()
    ledger = open_ledger(tmp_path / "n")
    if indexed_first == "B":
        ledger.ingest([b.data])
        assert set(ledger.indexed()) == {b.cid.raw}
        ledger.ingest([a.data, merge.data])
    else:
        ledger.ingest([a.data, b.data])
        assert set(ledger.indexed()) == {a.cid.raw, b.cid.raw}
        ledger.ingest([merge.data])
    ledger.rebuild_library()  # the rebuild replaces the whole index, key map included
    ledger.ingest([delete.data])
    assert _live(ledger) == {b.cid.raw}
    _assert_index_matches_library(ledger)
    ledger.close()
    ledger = open_ledger(tmp_path / "n")
    assert ledger.index_status == "loaded"
    _assert_index_matches_library(ledger)
    ledger.close()
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], "an index update failed and was rebuilt"


def test_a_stale_index_is_rebuilt(tmp_path):
    blocks = random_history(random.Random(5), 20)
    ledger = open_ledger(tmp_path / "n")
    ledger.ingest([b.data for b in blocks[:10]])
    ledger.close()
    saved = ((tmp_path / "n" / INDEX_FILE).read_bytes(), (tmp_path / "n" / META_FILE).read_bytes())
    ledger = open_ledger(tmp_path / "n")
    ledger.ingest([b.data for b in blocks[10:]])
    live = _live(ledger)
    ledger.close()
    (tmp_path / "n" / INDEX_FILE).write_bytes(saved[0])  # as if the node died before saving the newer index
    (tmp_path / "n" / META_FILE).write_bytes(saved[1])
    ledger = open_ledger(tmp_path / "n")
    assert ledger.index_status.startswith("stale") and set(ledger.indexed()) == live
    ledger.close()


@pytest.mark.parametrize("change", ["fields", "entries", "dead"])
def test_a_key_map_in_another_format_is_rebuilt(tmp_path, change):
    """A key map whose digest holds but whose fields (or its entries' width) are not this version's."""
    from ledger.index import _digest  # the file format's own checksum, to forge a well-formed file

    ledger = open_ledger(tmp_path / "n")
    ledger.ingest([f.add().data])
    live = _live(ledger)
    ledger.close()
    index_bytes, stored = (tmp_path / "n" / INDEX_FILE).read_bytes(), (tmp_path / "n" / META_FILE).read_bytes()
    if change == "fields":
        other_format, error = b"\xa1\x61v\x02", "KeyError"  # {"v": 2}
    elif change == "dead":  # a dead key the graph does not hold
        meta = codec.unpack(stored[32:])
        other_format, error = codec.pack({**meta, "dead": (2**40).to_bytes(8, "big")}), "its graph"
    else:
        meta = codec.unpack(stored[32:])
        other_format, error = codec.pack({**meta, "entries": meta["entries"] + b"\x00" * 4}), "ValueError"
    (tmp_path / "n" / META_FILE).write_bytes(_digest(other_format, index_bytes) + other_format)
    ledger = open_ledger(tmp_path / "n")
    assert ledger.index_status.startswith(f"unreadable ({error}") and set(ledger.indexed()) == live
    ledger.close()


def _flip(data: bytes, positions: list[int]) -> bytes:
    damaged = bytearray(data)
    for position in positions:
        damaged[position] ^= 0xA5
    return bytes(damaged)


def _damaged_copies(intact: Path, other: Path, into: Path) -> list[Path]:
    """Copies of the intact data directory, each with its saved index damaged in another way."""
    index, meta = (intact / INDEX_FILE).read_bytes(), (intact / META_FILE).read_bytes()
    size, rng = len(index), random.Random(7)
    index_cases = {
        **{f"flip-header-{p}": _flip(index, [p]) for p in (0, 1, 4, 8, 16, 24, 32, 40, 48, 56, 63, 64, 72, 80, 100)},
        **{f"flip-middle-{p}": _flip(index, [p]) for p in (size // 3, size // 2, 2 * size // 3)},
        **{f"flip-end-{p}": _flip(index, [p]) for p in (size - 64, size - 8, size - 1)},
        **{f"flip-20-random-{s}": _flip(index, rng.sample(range(size), 20)) for s in range(12)},
        **{f"truncate-to-{n}": index[:n] for n in (0, 10, 64, size // 2, size - 1)},
        "one-byte-more": index + b"\x00",
        "index-of-another-node": (other / INDEX_FILE).read_bytes(),
    }
    meta_cases = {
        "meta-flip-middle": _flip(meta, [len(meta) // 2]),
        "meta-flip-last": _flip(meta, [len(meta) - 1]),
        "meta-truncated": meta[:10],
        "meta-empty": b"",
    }
    copies = []
    for name, content in [*index_cases.items(), *meta_cases.items(), ("pair-of-another-node", None)]:
        copy = into / name
        shutil.copytree(intact, copy)
        if name == "pair-of-another-node":
            shutil.copy(other / INDEX_FILE, copy / INDEX_FILE)
            shutil.copy(other / META_FILE, copy / META_FILE)
        else:
            (copy / (META_FILE if name.startswith("meta-") else INDEX_FILE)).write_bytes(content)
        copies.append(copy)
    return copies


def test_a_damaged_truncated_or_foreign_index_is_rebuilt_before_usearch_reads_it(tmp_path):
    """Every kind of damage rebuilds the index; retrieval then answers as from the intact index, also after a restart.

    The damaged directories are opened in another process: a damaged file that reached usearch
    could crash it, which must show as this test failing, not as a dead test run.
    """
    intact = tmp_path / "intact"
    ledger = open_ledger(intact)
    blocks = random_history(random.Random(11), 400, authors=5)
    for start in range(0, len(blocks), 50):
        ledger.ingest([b.data for b in blocks[start : start + 50]])
    words = [
        "segment",
        "circle",
        "bound",
        "parity",
        "sum",
        "grid",
        "path",
        "induction",
        "invariant",
        "rate",
        "term",
        "case",
    ]
    rng = random.Random(12)
    ledger.ingest([f.add(f"When stuck, try {' '.join(rng.sample(words, 5))}.", f.author(6)).data for _ in range(150)])
    generation = ledger.view().generation
    ledger.close()
    other = open_ledger(tmp_path / "other")  # a node with other experiences at the same library generation
    while other.view().generation < generation:
        other.ingest([f.add(f"When counting case {other.view().generation}, enumerate small sizes first.").data])
    assert other.view().generation == generation
    other.close()

    copies = _damaged_copies(intact, tmp_path / "other", tmp_path / "damaged")
    probe = subprocess.run(
        [sys.executable, "-m", "tests.index_probe", str(intact), *map(str, copies)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
    )
    lines = probe.stdout.splitlines()
    opened = [line[5:] for line in lines if line.startswith("OPEN ")]
    assert probe.returncode == 0, f"the probe died (exit {probe.returncode}) opening {opened[-1]}:\n{probe.stderr}"
    reports = [json.loads(line) for line in lines if line.startswith("{")]
    expected = reports[0]
    assert expected["status"] == "loaded" and len(expected["indexed"]) > 100
    assert expected["indexed"] == expected["live"] and all(expected["answers"])
    assert len(reports) == 2 * (1 + len(copies))
    for report in reports[2:]:
        name = Path(report["dir"]).name
        if report["attempt"] == 1:
            assert report["status"] != "loaded", f"{name}: the damaged index was loaded"
        else:
            assert report["status"] == "loaded", f"{name}: the rebuilt index was not saved"
        assert report["indexed"] == report["live"] == expected["live"], name
        assert report["answers"] == expected["answers"], name
    statuses = {Path(r["dir"]).name: r["status"] for r in reports if r["attempt"] == 1}
    assert statuses["pair-of-another-node"].startswith("copied from another data directory")


def test_a_restored_index_inserts_and_searches_with_the_ledgers_settings(tmp_path):
    """usearch saves the graph but not its expansion settings: after a restart it inserted with its
    default (128 instead of 32), ~3.5x the CPU per insert at 200,000 vectors."""
    ledger = open_ledger(tmp_path / "n")
    ledger.ingest([f.add().data])
    ledger.close()
    ledger = open_ledger(tmp_path / "n")
    try:
        assert ledger.index_status == "loaded"
        restored, fresh = ledger._index._index, hnsw(f.PARAMS.embedding_dim)
        assert (restored.expansion_add, restored.expansion_search) == (fresh.expansion_add, fresh.expansion_search)
        assert str(restored.dtype) == str(fresh.dtype) == "ScalarKind.I8"
    finally:
        ledger.close()
