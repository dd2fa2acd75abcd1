"""The node-local retrieval model: its crash-safe index, library changes, identical answers, the daemon's background
embedding across restarts and kill -9."""

import json
import random
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ledger.cid import CID_LENGTH
from ledger.ledger import Ledger
from ledger.local_index import LocalIndex, LocalRetrieval
from ledger.local_model import MiniLMInt8, context_clause
from ledger.ops import Kind
from ledger.retrieval import INLINE_EMBED, Retriever
from tests import factories as f
from tests.daemons import init_home, running, start
from tests.test_retrieval import PARAMS, add, content

SET = json.loads((Path(__file__).parent.parent / "bench" / "retrieval_set.json").read_text())
BY_ID = {e["id"]: e for e in SET["experiences"]}


@pytest.fixture(scope="module")
def model():
    return MiniLMInt8()


def _ids(count: int) -> list[bytes]:
    return [bytes([1]) + i.to_bytes(CID_LENGTH - 1, "big") for i in range(count)]


def _vectors(count: int, dim: int, seed: int = 1) -> np.ndarray:
    rows = np.random.default_rng(seed).normal(size=(count, dim)).astype(np.float32)
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def test_the_index_is_kept_across_restarts_and_a_torn_or_damaged_tail_is_cut(tmp_path):
    ids, vectors = _ids(3), _vectors(3, 8)
    index = LocalIndex(tmp_path, "m", 8)
    index.add(zip(ids, ids, vectors, strict=True))
    query = vectors[0] + 0.5 * vectors[2]
    answer = index.search(query, 3)
    index.close()
    whole = index.path.stat().st_size
    with open(index.path, "ab") as handle:
        handle.write(b"\x07" * 30)  # a record cut short by kill -9
    again = LocalIndex(tmp_path, "m", 8)
    assert again.versions() == {i: i for i in ids} and again.search(query, 3) == answer
    assert again.path.stat().st_size == whole
    again.close()
    data = bytearray(index.path.read_bytes())
    data[-10] ^= 0xFF  # the last record damaged: it and only it is dropped
    index.path.write_bytes(bytes(data))
    damaged = LocalIndex(tmp_path, "m", 8)
    assert set(damaged.versions()) == set(ids[:2])
    damaged.close()
    other_model = LocalIndex(tmp_path, "m", 16)  # another dimension (or model): its vectors are never used
    assert len(other_model) == 0
    other_model.close()


def test_a_superseded_version_leaves_search_and_compaction_keeps_the_current_vectors_exactly(tmp_path):
    ids = _ids(4)
    index = LocalIndex(tmp_path, "m", 8)
    for round_ in range(400):  # many versions of each experience: the file is mostly superseded records
        index.add(
            (exp_id, bytes([round_ % 256]) * CID_LENGTH, v)
            for exp_id, v in zip(ids, _vectors(4, 8, round_), strict=True)
        )
    current = {exp_id: bytes([399 % 256]) * CID_LENGTH for exp_id in ids}
    assert index.retain({**current, ids[0]: b"\x00" * CID_LENGTH}) == 1  # ids[0] now live at another version
    query = _vectors(1, 8, 1000)[0]
    answer = index.search(query, 4)
    assert ids[0] not in dict(answer)
    assert index.compact()
    assert index.path.stat().st_size < 4 * 200  # three records and a header
    assert index.search(query, 4) == answer
    index.close()
    reopened = LocalIndex(tmp_path, "m", 8)
    assert reopened.search(query, 4) == answer
    reopened.close()


def _library(tmp_path: Path, name: str, ids: list[str]) -> tuple[Ledger, dict[str, object]]:
    ledger = Ledger.open(tmp_path / name, PARAMS)
    blocks = {i: add(BY_ID[i]["text"], tuple(BY_ID[i]["domain"].split(".")), 1 + n % 5) for n, i in enumerate(ids)}
    return ledger, blocks


def test_modify_delete_and_merge_are_reflected_in_the_local_index(tmp_path, model):
    ledger, blocks = _library(tmp_path, "n", ["g1", "g2", "g3", "c3", "c4", "c6", "n1", "n6", "sh4", "sh5"])
    try:
        assert {r.outcome for r in ledger.ingest([b.data for b in blocks.values()])} == {"applied"}
        local = LocalRetrieval(ledger, model)
        retriever = Retriever(ledger, local)
        while local.step(most=3):
            pass
        assert local.missing == 0 and len(local.index) == 10
        problem = "df says the disk is full, but du over every directory adds up to only half of it."
        first = retriever.retrieve(problem, k=1)[0]
        assert first.id == blocks["sh4"].cid and first.ranked_by == model.name
        # modify: the old text is never served again, the new version is ranked by the local model
        new_text = "When a full disk does not match the sizes of its files, list deleted files still held open."
        modify = f.signed(
            f.operation(Kind.MODIFY, clock=2, parents=[blocks["sh4"].cid], target=blocks["sh4"].cid,
                        content=content(new_text, ("devops", "shell"))),
            f.author(1),
        )  # fmt: skip
        delete = f.signed(
            f.operation(Kind.DELETE, clock=2, parents=[blocks["n6"].cid], target=blocks["n6"].cid, reason="wrong")
        )
        merged_text = "When seats are arranged in a circle, fix one seat, then count the adjacency constraints."
        merge = f.signed(
            f.operation(
                Kind.MERGE,
                clock=2,
                parents=[blocks["c3"].cid, blocks["c6"].cid],
                targets=tuple(sorted([blocks["c3"].cid, blocks["c6"].cid])),
                content=content(merged_text, ("math", "combinatorics")),
                reason="same pattern",
            )
        )
        assert {r.outcome for r in ledger.ingest([modify.data, delete.data, merge.data])} == {"applied"}
        hits = retriever.retrieve(problem, k=10, threshold=-1)
        assert [h.text for h in hits if h.id == blocks["sh4"].cid] == [new_text]
        assert all(h.ranked_by == model.name for h in hits)  # three new versions: embedded by the query itself
        while local.step():
            pass
        live = ledger.indexed()
        assert local.index.versions() == live  # exactly the live versions: superseded ones left search
        assert blocks["n6"].cid.raw not in live and blocks["c3"].cid.raw not in live and merge.cid.raw in live
        seating = retriever.retrieve("Eight guests sit around a round table; two refuse to sit together.", k=10,
                                     threshold=-1)  # fmt: skip
        shown = {h.id for h in seating}
        assert merge.cid in shown and blocks["c3"].cid not in shown and blocks["c6"].cid not in shown
        assert blocks["n6"].cid not in {h.id for h in retriever.retrieve("trailing zeros of 100!", k=10, threshold=-1)}
        local.close()
    finally:
        ledger.close()


def test_experiences_without_a_local_vector_are_ranked_by_the_network_embedding(tmp_path, model):
    ids = [e["id"] for e in SET["experiences"] if e["domain"] == "devops.shell"]
    ledger, blocks = _library(tmp_path, "n", ids)
    try:
        ledger.ingest([b.data for b in blocks.values()])
        local = LocalRetrieval(ledger, model)
        hits = Retriever(ledger, local).retrieve("Our Java service sometimes disappears overnight.", threshold=-1)
        assert len(ids) > INLINE_EMBED and len(hits) == 5  # too many to embed in a query: never missing meanwhile
        assert {h.ranked_by for h in hits} == {"network"}
        local.close()
    finally:
        ledger.close()


def test_two_nodes_holding_the_same_library_answer_identically(tmp_path, model):
    """The same operations in different orders and batches, embedded in different step sizes: same answers."""
    ids = [e["id"] for e in SET["experiences"]][::4]
    problems = [p["problem"] for p in SET["problems"]][::5]
    answers = []
    for name, seed, most in (("a", 1, 5), ("b", 2, 17)):
        ledger, blocks = _library(tmp_path, name, ids)
        try:
            data = [b.data for b in blocks.values()]
            random.Random(seed).shuffle(data)
            for start in range(0, len(data), 7 * seed):
                ledger.ingest(data[start : start + 7 * seed])
            local = LocalRetrieval(ledger, model)
            while local.step(most=most):
                pass
            retriever = Retriever(ledger, local)
            answers.append([[(h.id, h.score, h.ranked_by) for h in retriever.retrieve(p, 5, 0.0)] for p in problems])
            local.close()
        finally:
            ledger.close()
    assert answers[0] == answers[1]
    assert all(len(answer) == 5 and answer[0][2] == model.name for answer in answers[0])


def test_context_clause():
    assert context_clause("When a loop is slow, profile it.") == "a loop is slow"
    assert context_clause("For sums of powers, try induction.") == "sums of powers"
    assert context_clause("A monotone condition implies binary search works.") == "A monotone condition"
    assert context_clause("Always check small cases.") is None


def _status(daemon) -> dict:
    return daemon.call("status")["retrieval"]


def test_background_embedding_survives_kill_9_and_resumes_after_a_restart(tmp_path, model):
    home = tmp_path / "home"
    init_home(home)
    experiences = SET["experiences"][:150]
    daemon = start(home)
    try:
        for e in experiences:
            daemon.call("add", {"text": e["text"], "domain": e["domain"], "confidence": 0.8})
        seen = _status(daemon)
        while seen["missing"] == len(experiences):  # wait for the background task to have stored some vectors
            seen = _status(daemon)
        assert seen["model"] == model.name and seen["live"] == len(experiences)
    finally:
        daemon.stop(signal.SIGKILL)
    index = LocalIndex(home / "data", model.name, model.dim)  # what kill -9 left on disk: intact records only
    kept = index.versions()
    index.close()
    assert len(kept) >= len(experiences) - seen["missing"]
    with running(home) as again:
        status = _status(again)
        assert status["missing"] <= len(experiences) - len(kept)  # nothing embedded before the kill is redone
        while status["missing"]:
            status = _status(again)
        answer = again.call("retrieve", {"query": SET["problems"][0]["problem"], "k": 3})["hits"]
        assert answer and {hit["ranked_by"] for hit in answer} == {model.name}
    with running(home) as third:  # a clean stop and start: everything still there
        assert _status(third)["missing"] == 0
        assert third.call("retrieve", {"query": SET["problems"][0]["problem"], "k": 3})["hits"] == answer


@pytest.mark.parametrize(
    "imports",
    ["import ledger, usearch.index", "import bench.bench_index", "import bench.bench_network"],
)
def test_the_retrieval_model_loads_whatever_was_imported_before_it(imports):
    """usearch exports a static libstdc++ that crashed onnxruntime's import when usearch came first (SIGSEGV in
    bench_network); ledger/__init__.py loads the system one first."""
    code = f"{imports}\nfrom ledger.local_model import MiniLMInt8\nMiniLMInt8().embed_query('a')"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
