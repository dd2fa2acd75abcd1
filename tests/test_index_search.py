"""Index answers depend only on the vectors (exact search) or on the insertion order (HNSW), never on threads."""

import random
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ledger.index as index_module
from ledger.cid import CID
from ledger.embedder import pack_float16
from ledger.index import INDEX_FILE, ExperienceIndex
from tests import factories as f

DIM = f.PARAMS.embedding_dim


def _experiences(seed: int, size: int) -> dict[bytes, tuple[bytes, bytes]]:
    """id -> (version, float16 vector): clustered like real embeddings, a tenth of them exact copies (ties)."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((8, DIM))
    vectors = centres[rng.integers(0, 8, size)] + 0.4 * rng.standard_normal((size, DIM))
    vectors[rng.integers(0, size, size // 10)] = vectors[rng.integers(0, size, size // 10)]
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    ids = [CID.for_block(seed.to_bytes(8, "big") + i.to_bytes(8, "big")).raw for i in range(size)]
    made = {exp_id: (exp_id, pack_float16(vector)) for exp_id, vector in zip(ids, vectors, strict=True)}
    _STORED.update((version, values) for version, values in made.values())
    return made


def _queries(seed: int, experiences: dict[bytes, tuple[bytes, bytes]], count: int = 40) -> list[np.ndarray]:
    """Random directions and stored vectors themselves (whose nearest neighbours include exact ties)."""
    rng = np.random.default_rng(seed + 1)
    stored = [np.frombuffer(v, dtype="<f2").astype(np.float32) for _, v in experiences.values()]
    queries = [rng.standard_normal(DIM).astype(np.float32) for _ in range(count // 2)]
    queries += [stored[i] for i in rng.integers(0, len(stored), count - len(queries))]
    return [q / np.linalg.norm(q) for q in queries]


#: every vector any test indexed, by version: what a ledger's stored embeddings are to its index
_STORED: dict[bytes, bytes] = {}


def _stored(versions: list[bytes]) -> np.ndarray:
    return np.stack([np.frombuffer(_STORED[version], dtype="<f2").astype(np.float32) for version in versions])


def _open(directory: Path, exact_limit: int) -> ExperienceIndex:
    return ExperienceIndex(directory, f.PARAMS.embedding_model, DIM, "did:key:test", _stored, exact_limit=exact_limit)


def _index(directory: Path, exact_limit: int) -> ExperienceIndex:
    directory.mkdir()
    return _open(directory, exact_limit)


def _feed(index: ExperienceIndex, experiences: dict, rng: random.Random) -> None:
    """Index `experiences` through `update` in random batches and order, adding and removing strays on the way."""
    order = list(experiences)
    rng.shuffle(order)
    strays = _experiences(rng.randrange(2**32), 30)
    start = 0
    while start < len(order):
        end = start + rng.randint(1, 50)
        added = {exp_id: strays.pop(exp_id) for exp_id in rng.sample(sorted(strays), min(len(strays), 3))}
        index.update({**{exp_id: experiences[exp_id] for exp_id in order[start:end]}, **added}, [])
        indexed_strays = sorted(index.ids() - set(experiences))
        index.update({}, rng.sample(indexed_strays, min(len(indexed_strays), 2)))
        start = end
    index.update({}, sorted(index.ids() - set(experiences)))


def _answers(index: ExperienceIndex, queries: list[np.ndarray], count: int) -> list[list[tuple[bytes, float]]]:
    return [index.search(query, count) for query in queries]


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1), size=st.integers(1, 600), count=st.integers(1, 20))
def test_below_the_limit_search_is_exact_and_independent_of_insertion_order(tmp_path_factory, seed, size, count):
    experiences = _experiences(seed, size)
    queries = _queries(seed, experiences)
    base = tmp_path_factory.mktemp("indexes")
    rng = random.Random(seed)
    rebuilt = _index(base / "rebuilt", exact_limit=size)
    rebuilt.rebuild(((exp_id, *item) for exp_id, item in sorted(experiences.items())), size, 0)
    shuffled = _index(base / "shuffled", exact_limit=size)
    _feed(shuffled, experiences, rng)
    shuffled.save()
    restored = _open(base / "shuffled", exact_limit=size)
    assert restored.load(-1) is None

    expected = _answers(rebuilt, queries, count)
    assert _answers(shuffled, queries, count) == expected
    assert _answers(restored, queries, count) == expected
    matrix = np.stack([np.frombuffer(v, dtype="<f2").astype(np.float64) for _, v in experiences.values()])
    matrix /= np.linalg.norm(matrix, axis=1, keepdims=True)
    truth = dict(zip(experiences, matrix, strict=True))
    for query, answer in zip(queries, expected, strict=True):
        scores = sorted(matrix @ query, reverse=True)
        assert len(answer) == min(count, size)
        assert [score for _, score in answer] == sorted((score for _, score in answer), reverse=True)
        for exp_id, score in answer:  # each score right, and none better left out
            assert abs(score - truth[exp_id] @ query) < 1e-5
            assert truth[exp_id] @ query >= scores[len(answer) - 1] - 1e-5


def test_above_the_limit_the_same_insertion_order_builds_the_same_graph(tmp_path):
    """HNSW (forced by a limit of 0) built twice from the same batches: identical files and answers.

    Each batch reaches `update` as a dict in another order, as the ledger collects changes in a set.
    """
    experiences = _experiences(3, 3000)
    queries = _queries(3, experiences, 200)
    order = sorted(experiences)
    random.Random(4).shuffle(order)
    batches = [order[start : start + 700] for start in range(0, len(order), 700)]
    indexes = []
    for name, seed in (("first", 5), ("second", 6)):
        index = _index(tmp_path / name, exact_limit=0)
        for batch in batches:
            random.Random(seed).shuffle(batch)
            index.update({exp_id: experiences[exp_id] for exp_id in batch}, [])
        index.save()
        indexes.append(index)
    assert (tmp_path / "first" / INDEX_FILE).read_bytes() == (tmp_path / "second" / INDEX_FILE).read_bytes()
    assert _answers(indexes[0], queries, 5) == _answers(indexes[1], queries, 5)


def test_a_library_that_shrinks_back_below_the_limit_is_searched_exactly_again(tmp_path):
    """Above twice the limit the exact rows are dropped (the graph's int8 vectors are not exact); below the
    limit again they are read from the stored embeddings, and a restored index saved without them does too."""
    experiences = _experiences(11, 60)
    queries = _queries(11, experiences)
    order = sorted(experiences)
    grown = _index(tmp_path / "grown", exact_limit=10)
    grown.update(dict(experiences), [])
    assert grown._exact is None  # 60 > 2 x 10
    grown.save()
    kept = {exp_id: experiences[exp_id] for exp_id in order[:9]}
    rebuilt = _index(tmp_path / "rebuilt", exact_limit=10)
    rebuilt.rebuild(((exp_id, *item) for exp_id, item in sorted(kept.items())), len(kept), 0)
    expected = _answers(rebuilt, queries, 5)

    grown.update({}, order[9:])
    assert _answers(grown, queries, 5) == expected
    restored = _open(tmp_path / "grown", exact_limit=100)  # saved at 60 experiences, without exact rows
    assert restored.load(-1) is None and restored._exact is None
    restored.update({}, order[9:])
    assert _answers(restored, queries, 5) == expected


def test_vectors_of_any_length_are_indexed_by_their_direction(tmp_path):
    """int8 holds [-1, 1]: a stored embedding longer than 1 (validation checks directions, not lengths) must be
    indexed as its unit vector, not clipped (usearch normalises before it quantises for the cosine metric)."""
    experiences = _experiences(12, 400)
    scaled = {
        exp_id: (version, pack_float16(np.frombuffer(values, dtype="<f2").astype(np.float32) * 40))
        for exp_id, (version, values) in experiences.items()
    }
    index = _index(tmp_path / "hnsw", exact_limit=0)
    index.update(scaled, [])
    distinct = {values for _, values in experiences.values()}  # a tenth of them are copies
    hits = 0
    for values in distinct:
        found = index.search(np.frombuffer(values, dtype="<f2").astype(np.float32), 1)
        hits += found[0][1] > 0.999
    assert hits / len(distinct) > 0.95


def test_dead_nodes_are_never_answered_and_stay_within_a_factor_of_the_live(tmp_path, monkeypatch):
    """Removed and superseded experiences stay in the graph as dead nodes (usearch's reuse of a removed node's
    slot made inserts ~2x dearer); searches skip them, a save keeps them, and beyond one dead node per live one
    the oldest are removed the usearch way."""
    monkeypatch.setattr(index_module, "_DEAD_SLACK", 0)
    experiences = _experiences(13, 900)
    queries = _queries(13, experiences)
    order = sorted(experiences)
    index = _index(tmp_path / "hnsw", exact_limit=0)
    index.update({exp_id: experiences[exp_id] for exp_id in order[:600]}, [])
    newer = _experiences(14, 150)  # new versions of 150 of them (their old nodes die), and 150 removed
    superseded = dict(zip(order[:150], newer.values(), strict=True))
    index.update(superseded, order[150:300])
    live = {**{exp_id: experiences[exp_id] for exp_id in order[300:600]}, **superseded}
    assert len(index) == len(live) == 450 and len(index._index) == 600 + 150  # 300 dead

    def check(searched: ExperienceIndex) -> None:
        for query in queries:
            answer = searched.search(query, 10)
            assert len(answer) == 10 and all(exp_id in live for exp_id, _ in answer)

    check(index)
    index.save()
    restored = _open(tmp_path / "hnsw", exact_limit=0)
    assert restored.load(-1) is None and len(restored._index) == 750
    check(restored)
    index.update({}, order[300:480])  # 270 live: no more than 270 dead nodes stay
    live = {exp_id: item for exp_id, item in live.items() if exp_id not in order[300:480]}
    assert len(index) == 270 and len(index._index) == 2 * 270
    check(index)
    index.update({exp_id: experiences[exp_id] for exp_id in order[600:700]}, [])  # into the freed slots
    live.update({exp_id: experiences[exp_id] for exp_id in order[600:700]})
    check(index)


def test_exact_rows_have_room_reserved_and_are_never_copied_to_grow(tmp_path):
    """Growing the rows copied them all while the index thread held the lock searches wait for (~130 ms at
    39,000 rows): room for every row the index keeps is reserved, also for rows loaded from a saved index."""
    experiences = _experiences(31, 20)
    order = sorted(experiences)
    index = _index(tmp_path / "exact", exact_limit=10)  # rows kept up to twice the limit
    reserved = index._exact._rows
    for start in range(0, 12, 3):
        index.update({exp_id: experiences[exp_id] for exp_id in order[start : start + 3]}, [])
    assert index._exact._rows is reserved
    index.save()
    restored = _open(tmp_path / "exact", exact_limit=10)
    assert restored.load(-1) is None
    reserved = restored._exact._rows
    restored.update({exp_id: experiences[exp_id] for exp_id in order[12:]}, [])
    assert restored._exact._rows is reserved and len(restored._exact) == 20
    queries = _queries(31, experiences)
    fresh = _index(tmp_path / "fresh", exact_limit=10)
    fresh.update(experiences, [])
    assert _answers(restored, queries, 5) == _answers(fresh, queries, 5)
