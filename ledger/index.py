"""The vector index: usearch HNSW (cosine, int8) over the live experiences, kept in step with the library.

The index is derived state. It is saved beside the ledger with the library generation it
reflects, the identity of the data directory it belongs to and a SHA-256 digest over both files;
at start-up an index that is missing, damaged, copied from another data directory, for another
model, or older than the library is rebuilt from the library (with progress), so it never serves
a deleted or superseded version for long: updates follow every committed batch. usearch does not
validate what it loads (a few flipped bytes crash the process in search), so no byte of the saved
index reaches usearch before the digest over it has been checked.

Answers do not depend on thread scheduling: vectors are added one thread at a time, in an order
fixed by the batch's contents, and a library of up to `EXACT_SEARCH_LIMIT` experiences is searched
exactly, so nodes holding the same library give the same answer whatever order they indexed it in.
The graph holds its vectors as int8, so the exact search keeps float32 rows of its own (saved with
the key map) while the library is small.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections import deque
from collections.abc import Callable, Container, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

import numpy as np
from usearch.index import Index  # after ledger/__init__.py has loaded the system libstdc++

from ledger import codec
from ledger.cid import CID_LENGTH
from ledger.embedder import unit, unpack_float16_rows

log = logging.getLogger(__name__)

INDEX_FILE = "index.usearch"
META_FILE = "index.meta"
#: Up to this many experiences a search scores every vector instead of asking HNSW: the answer is
#: then exact and the same on every node whatever the insertion order. bench/bench_index.py on 2
#: cores, real WordLlama vectors: exact p50 0.67 ms at 20,000 (x1.7 HNSW; x1.3 at 10,000), ~1 ms at
#: 30,000 (x2.2), 1.7 ms at 50,000 (x3.8): it grows linearly, HNSW barely.
EXACT_SEARCH_LIMIT = 20_000
#: the exact rows are kept up to this many times the limit, so a library that shrinks back below the limit
#: does not read every stored embedding again unless it had grown well beyond it
_EXACT_KEPT = 2
_DIGEST_SIZE = 32  # SHA-256, faster here than BLAKE2b (the CPU has SHA extensions; bench_index prints both)
#: a float32 dot product of unit vectors is off by at most dim * 2**-24 (1.5e-5 at 256-d, 2.3e-5 at 384-d)
_SHORTLIST_MARGIN = 1e-4
_BATCH = 1000  # vectors per usearch call during a rebuild, between progress reports


#: expansion_add 32 (usearch's default 128): inserts are the index thread's whole cost, and it
#: shares 2 cores with the writer: 578 -> ~290 us CPU per insert at 100k, recall@5 0.994 -> 0.988
#: on experience-like text (its misses are mostly ties between identical texts; retrieval rescores
#: 2k + 8 candidates exactly)
_EXPANSION_ADD = 32
_EXPANSION_SEARCH = 64
#: the graph's vectors as int8 (unit vectors x 127), not float16: at 200,000 of the benchmark workload's vectors an
#: insert 344 -> 216 us of CPU, a search 0.59 -> 0.40 ms, the graph 187 -> 120 MB. The exact top 5 found among
#: the 18 candidates retrieval asks for: 0.985 -> 0.986 on experience-like text, 0.822 -> 0.772 on the
#: workload's texts (four random pseudo-words each: many near ties). Retrieval scores candidates again from
#: the stored embeddings. A saved float16 index is used as it is until it is rebuilt.
_DTYPE = "i8"
#: Removed and superseded experiences stay in the graph as dead nodes that searches skip: usearch's own removal
#: hands a node's slot to the next insert, which relinks the slot but not the links still pointing at it (its
#: compaction only cuts links, leaving the graph in pieces once many go), and with removals between inserts
#: (every modify) an insert cost 647 us of CPU instead of 285 at 100,000 vectors, with lower recall; in a window of
#: 20,000 operations after 200,000 the index thread 129 -> 73 us per operation. Beyond this many dead nodes per
#: live one (and a slack), the oldest are removed the usearch way, so memory stays within (1 + factor) times the
#: live experiences' graph and inserts cost what they did before (the workload has 0.6 at 1M operations).
_DEAD_FACTOR = 1
_DEAD_SLACK = 1024


def hnsw(dim: int) -> Index:
    """An empty usearch index with the ledger's parameters (also the benchmark's baseline)."""
    return Index(
        ndim=dim,
        metric="cos",
        dtype=_DTYPE,
        connectivity=16,
        expansion_add=_EXPANSION_ADD,
        expansion_search=_EXPANSION_SEARCH,
    )


def _restore(index_bytes: bytes) -> Index:
    """A saved index with the ledger's parameters. usearch saves the graph but not the expansion
    settings: a restored index inserted with expansion_add 128, 648 -> 2,287 us of CPU per insert
    at 200,000 vectors, after every restart."""
    index = Index.restore(index_bytes)
    index.expansion_add, index.expansion_search = _EXPANSION_ADD, _EXPANSION_SEARCH
    return index


#: the stored embeddings (float16, as float32 rows) of the given version CIDs, in that order
VectorSource = Callable[[list[bytes]], np.ndarray]


class ExperienceIndex:
    """usearch HNSW index whose keys map back to experience ids, with exact search for small libraries.

    Keys come from a local counter, never from the ids themselves: a key derived from a CID
    could be made to collide by anyone able to sign many operations.
    """

    def __init__(
        self,
        directory: Path,
        model: str,
        dim: int,
        owner: str,
        vectors: VectorSource,
        *,
        exact_limit: int = EXACT_SEARCH_LIMIT,
    ):
        """`owner` names the data directory (its node's DID): a saved index from any other is refused.
        `vectors` reads stored embeddings: the exact rows of a library that shrank back below the limit."""
        self._directory = directory
        self._model = model
        self._dim = dim
        self._owner = owner
        self._vectors = vectors
        self._exact_limit = exact_limit
        self._exact_rows = _EXACT_KEPT * exact_limit  # the most exact rows kept (room for them is reserved)
        self._clear()
        self.generation = -1

    def _clear(self) -> None:
        self._saved_generation: int | None = None  # the generation of the files on disk, while they hold this index
        self._index = hnsw(self._dim)
        self._dead: deque[int] = deque()  # keys in the graph whose experience is no longer indexed, oldest first
        self._ids: dict[int, bytes] = {}
        self._key_of: dict[bytes, int] = {}
        self._version: dict[bytes, bytes] = {}  # experience id -> the version CID its vector comes from
        self._next_key = 0
        #: every indexed vector as an exact row, kept up to _EXACT_KEPT times the limit (None above it)
        self._exact: ExactVectors | None = ExactVectors(self._dim, self._exact_rows)

    def __len__(self) -> int:
        return len(self._ids)

    def __contains__(self, exp_id: object) -> bool:
        return exp_id in self._key_of

    def ids(self) -> set[bytes]:
        return set(self._ids.values())

    def versions(self) -> dict[bytes, bytes]:
        """Each indexed experience id with the version CID its vector comes from."""
        return dict(self._version)

    def holds(self, exp_id: bytes, version: bytes) -> bool:
        """Whether the experience is indexed with the vector of that version."""
        return self._version.get(exp_id) == version

    def update(self, live: dict[bytes, tuple[bytes, bytes]], removals: Iterable[bytes]) -> None:
        """Apply one batch of changes; `live` maps experience id -> (version CID, float16 embedding).

        An experience already indexed at that version is left alone; the rest are added in one
        call, which usearch does far faster than one vector at a time, in id order so that the
        graph does not depend on the order the caller happened to collect them in.
        """
        for exp_id in removals:
            self.remove(exp_id)
        changed = sorted((exp_id, item) for exp_id, item in live.items() if self._version.get(exp_id) != item[0])
        for exp_id, _ in changed:
            self.remove(exp_id)
        if changed:
            self._add([(exp_id, version, values) for exp_id, (version, values) in changed])

    def _add(self, items: list[tuple[bytes, bytes, bytes]]) -> None:
        keys = []
        self._saved_generation = None
        for exp_id, version, _ in items:
            key, self._next_key = self._next_key, self._next_key + 1
            self._ids[key], self._key_of[exp_id], self._version[exp_id] = exp_id, key, version
            keys.append(key)
        vectors = unpack_float16_rows([values for _, _, values in items])
        # one thread: usearch's parallel add links the graph in scheduling order, so two builds
        # of the same vectors in the same order could answer differently
        self._index.add(np.array(keys, dtype=np.uint64), vectors, threads=1)
        if len(self) > _EXACT_KEPT * self._exact_limit:
            self._exact = None
        elif self._exact is not None:
            self._exact.add([exp_id for exp_id, _, _ in items], vectors)

    def remove(self, exp_id: bytes) -> None:
        """Stop indexing an experience: its node stays in the graph, dead, while dead nodes are few enough."""
        key = self._key_of.pop(exp_id, None)
        if key is not None:
            self._saved_generation = None
            self._dead.append(key)
            del self._ids[key], self._version[exp_id]
            if self._exact is not None:
                self._exact.remove(exp_id)
            while len(self._dead) > _DEAD_FACTOR * len(self._ids) + _DEAD_SLACK:
                self._index.remove(self._dead.popleft())  # its slot goes to a later insert

    def search(self, vector: np.ndarray, count: int, skip: Container[bytes] = frozenset()) -> list[tuple[bytes, float]]:
        """Up to `count` nearest experiences as (id, cosine similarity), best first, leaving out the ids in `skip`:
        exact up to the limit.

        HNSW is asked for a few more than `count` (the dead nodes among the nearest, and a margin), and again for
        twice as many while too few remain. Asking at once for `count` plus every skipped id, as the ledger did
        for the experiences with a queued change (~320 at 1M operations under ingest), widened each search's beam
        to ~500 candidates: with the backlog's scoring, 3.65 ms of a query's CPU under ingest, 1.30 ms now.
        """
        if not self._ids or count <= 0:
            return []
        query = np.asarray(vector, dtype=np.float32)
        if len(self._ids) <= self._exact_limit:
            if self._exact is None:  # it shrank back from well above the limit, or a saved index kept no rows
                ids = list(self._version)
                self._exact = ExactVectors(self._dim, self._exact_rows)
                self._exact.add(ids, self._vectors([self._version[exp_id] for exp_id in ids]))
            skipped = sum(1 for exp_id in skip if exp_id in self._key_of) if skip else 0
            found = self._exact.search(unit(query), count + skipped)
            return [item for item in found if item[0] not in skip][:count]
        wanted = min(count, len(self._ids))
        asked = wanted + wanted * len(self._dead) // len(self._ids) + 8  # the dead among the nearest, and a margin
        while True:
            matches = self._index.search(query, asked)
            found = [
                (exp_id, 1.0 - float(distance))
                for key, distance in zip(matches.keys.tolist(), matches.distances.tolist(), strict=True)
                if (exp_id := self._ids.get(key)) is not None and exp_id not in skip
            ]
            if len(found) >= wanted or asked >= len(self._index):
                return found[:wanted]
            asked *= 2

    def rebuild(
        self,
        live: Iterable[tuple[bytes, bytes, bytes]],
        total: int,
        generation: int,
        progress: Callable[[int, int], None] | None = None,
    ) -> None:
        """Index every (experience id, version CID, float16 embedding) from scratch."""
        self._clear()
        batch: list[tuple[bytes, bytes, bytes]] = []
        for item in live:
            batch.append(item)
            if len(batch) == _BATCH:
                self._add(batch)
                batch = []
                if progress:
                    progress(len(self), total)
        if batch:
            self._add(batch)
        if progress:
            progress(len(self), total)
        self.generation = generation

    # --- persistence -----------------------------------------------------------------------

    def save(self) -> None:
        """Write index and key map atomically (temporary files, then rename).

        The key map starts with a digest over itself and the index file, so a damaged, truncated,
        half-written or swapped file is found before usearch reads it. Nothing is written when the files
        already hold this index (at 1M operations, writing 145 MB made a close with nothing new take ~1 s).
        """
        if self._saved_generation == self.generation:
            return
        index_path, meta_path = self._directory / INDEX_FILE, self._directory / META_FILE
        index_bytes = self._index.save()
        meta = codec.pack(
            {
                "model": self._model,
                "dim": self._dim,
                "owner": self._owner,
                "generation": self.generation,
                "next_key": self._next_key,
                "dead": np.array(self._dead, dtype=">u8").tobytes(),
                "entries": b"".join(
                    key.to_bytes(8, "big") + exp_id + self._version[exp_id] for key, exp_id in self._ids.items()
                ),
                # the exact rows as they are (normalising them again could move a last bit, and a near tie)
                **({"exact": self._exact.to_bytes()} if self._exact is not None else {}),
            }
        )
        (self._directory / (INDEX_FILE + ".tmp")).write_bytes(index_bytes)
        (self._directory / (META_FILE + ".tmp")).write_bytes(_digest(meta, index_bytes) + meta)
        os.replace(str(index_path) + ".tmp", index_path)
        os.replace(str(meta_path) + ".tmp", meta_path)
        self._saved_generation = self.generation

    def load(self, generation: int) -> str | None:
        """Load the saved index; returns why it cannot be used (then it must be rebuilt), or None.

        The digest (SHA-256 over ~150 MB at 200,000 live experiences, ~100 ms without the GIL) is
        computed on a thread while the key map is parsed; nothing parsed is kept, and usearch reads
        nothing, unless it matches.
        """
        index_path, meta_path = self._directory / INDEX_FILE, self._directory / META_FILE
        try:
            stored = meta_path.read_bytes()
            index_bytes = index_path.read_bytes()
        except FileNotFoundError:
            return "missing"
        digest, packed = stored[:_DIGEST_SIZE], stored[_DIGEST_SIZE:]
        with ThreadPoolExecutor(1, thread_name_prefix="ledger-index-digest") as pool:
            checked = pool.submit(_digest, packed, index_bytes)
            parsed = _parse_meta(packed, self._exact_rows)
            if checked.result() != digest:
                return "damaged (the files do not match their digest)"
        # from here on the files are exactly what some `save` wrote, though perhaps not this node's
        if isinstance(parsed, str):
            return parsed
        if parsed.owner != self._owner:
            return f"copied from another data directory ({parsed.owner})"
        if (parsed.model, parsed.dim) != (self._model, self._dim):
            return f"built for {parsed.model} ({parsed.dim}-d)"
        if parsed.generation != generation:
            return f"stale (generation {parsed.generation}, library at {generation})"
        self._clear()
        self._index = _restore(index_bytes)
        if len(self._index) != len(parsed.ids) + len(parsed.dead):
            self._clear()
            return "unreadable (its graph does not hold its entries and dead keys)"
        self._dead = deque(parsed.dead)
        self.generation, self._next_key = generation, parsed.next_key
        self._ids, self._key_of, self._version = parsed.ids, parsed.key_of, parsed.version
        self._exact = parsed.exact if len(self._ids) <= _EXACT_KEPT * self._exact_limit else None
        self._saved_generation = generation
        return None


class _SavedMeta(NamedTuple):
    """A parsed key map: what some `save` wrote, not yet known to be this node's or current."""

    owner: str
    model: str
    dim: int
    generation: int
    next_key: int
    ids: dict[int, bytes]
    key_of: dict[bytes, int]
    version: dict[bytes, bytes]
    exact: ExactVectors | None  # None: saved without rows (above the kept size, or before int8)
    dead: list[int]  # keys of the graph no entry names (saved before dead nodes were kept: none)


#: one key map entry: usearch key (u64, big-endian), experience id, version CID
_ENTRY = np.dtype([("key", ">u8"), ("id", f"V{CID_LENGTH}"), ("version", f"V{CID_LENGTH}")])


def _parse_meta(packed: bytes, exact_rows: int) -> _SavedMeta | str:
    """The saved key map, or why it cannot be read (another format version). Vectorized: at 200,000
    entries, slicing them one by one in Python made up half of a restart."""
    try:
        meta = codec.unpack(packed)
        entries = np.frombuffer(meta["entries"], dtype=_ENTRY)
        keys, ids, versions = entries["key"].tolist(), entries["id"].tolist(), entries["version"].tolist()
        exact = ExactVectors.from_bytes(meta["exact"], meta["dim"], exact_rows) if "exact" in meta else None
        if exact is not None and set(exact.ids()) != set(ids):
            return "unreadable (its exact rows are not those of its entries)"
        dead = np.frombuffer(meta.get("dead", b""), dtype=">u8").tolist()
        return _SavedMeta(
            meta["owner"], meta["model"], meta["dim"], meta["generation"], meta["next_key"],
            dict(zip(keys, ids, strict=True)), dict(zip(ids, keys, strict=True)), dict(zip(ids, versions, strict=True)),
            exact, dead,
        )  # fmt: skip
    except Exception as exc:  # another format version: cbor2, numpy and the lookups raise various types
        return f"unreadable ({type(exc).__name__}: {exc})"


def _digest(meta: bytes, index_bytes: bytes | bytearray) -> bytes:
    """One SHA-256 over the key map (length first) and the index file, so neither can be swapped alone."""
    hasher = hashlib.sha256(len(meta).to_bytes(8, "big"))
    hasher.update(meta)
    hasher.update(index_bytes)
    return hasher.digest()


class ExactVectors:
    """Every indexed vector as a unit float32 row, for exact search; a removal moves the last row into the gap.

    Room for `capacity` rows is reserved at once: the system maps its pages only as rows are written, and
    growing past it copies every row (at 39,000 rows under ingest ~130 ms, which the index thread spent
    holding the lock searches wait for).
    """

    def __init__(self, dim: int, capacity: int = 1024) -> None:
        self._rows = np.empty((max(capacity, 1), dim), dtype=np.float32)
        self._ids: list[bytes] = []
        self._row_of: dict[bytes, int] = {}

    def add(self, ids: list[bytes], vectors: np.ndarray) -> None:
        """Append rows (float16 or float32 vectors), scaled in place to unit length."""
        start, end = len(self._ids), len(self._ids) + len(ids)
        if end > len(self._rows):
            grown = np.empty((max(end, 2 * len(self._rows)), self._rows.shape[1]), dtype=np.float32)
            grown[:start] = self._rows[:start]
            self._rows = grown
        block = self._rows[start:end]
        block[:] = vectors
        norms = np.linalg.norm(block, axis=1, keepdims=True)
        block /= np.where(norms > 0, norms, 1)
        self._row_of.update((exp_id, row) for row, exp_id in enumerate(ids, start))
        self._ids.extend(ids)

    def __len__(self) -> int:
        return len(self._ids)

    def ids(self) -> list[bytes]:
        return list(self._ids)

    def to_bytes(self) -> bytes:
        """The ids and rows as they are, for `from_bytes`: ids, then float32 rows (little-endian)."""
        return codec.pack({"ids": b"".join(self._ids), "rows": self._rows[: len(self._ids)].astype("<f4").tobytes()})

    @classmethod
    def from_bytes(cls, data: bytes, dim: int, capacity: int = 0) -> ExactVectors:
        """Rows saved by `to_bytes`, not normalised again, with room for `capacity`. Raises on a malformed value
        (a format the caller refuses)."""
        fields = codec.unpack(data)
        ids, rows = fields["ids"], np.frombuffer(fields["rows"], dtype="<f4")
        if len(ids) % CID_LENGTH or len(rows) != len(ids) // CID_LENGTH * dim:
            raise ValueError("exact rows and ids disagree")
        exact = cls(dim, max(capacity, len(ids) // CID_LENGTH))
        exact._ids = [ids[start : start + CID_LENGTH] for start in range(0, len(ids), CID_LENGTH)]
        exact._rows[: len(exact._ids)] = rows.reshape(-1, dim)
        exact._row_of = {exp_id: row for row, exp_id in enumerate(exact._ids)}
        return exact

    def vector(self, exp_id: bytes) -> np.ndarray | None:
        """The unit row of `exp_id`, or None."""
        row = self._row_of.get(exp_id)
        return None if row is None else self._rows[row].copy()

    def remove(self, exp_id: bytes) -> None:
        row, last = self._row_of.pop(exp_id), len(self._ids) - 1
        moved = self._ids.pop()
        if row != last:
            self._rows[row], self._ids[row], self._row_of[moved] = self._rows[last], moved, row

    def search(self, query: np.ndarray, count: int) -> list[tuple[bytes, float]]:
        """The `count` best rows, ties broken by id, so the answer does not depend on the row order.

        The float32 scores are one dot product per row (vecdot), on this thread: a BLAS matrix
        product is faster on an idle machine but its threads waited ~8 ms per query for a busy
        second core here. They only shortlist, with a margin far above float32 rounding; the
        shortlist is scored again in float64, row by row, where a row's position cannot change its score.
        """
        rows = self._rows[: len(self._ids)]
        shortlist = np.arange(len(rows))
        if count < len(rows):
            scores = np.vecdot(rows, query)
            kth = np.partition(scores, len(scores) - count)[len(scores) - count]
            shortlist = np.flatnonzero(scores >= kth - _SHORTLIST_MARGIN)
        exact = (rows[shortlist].astype(np.float64) * query.astype(np.float64)).sum(axis=1)
        best = sorted(zip((-exact).tolist(), (self._ids[row] for row in shortlist.tolist()), strict=True))[:count]
        return [(exp_id, -negated) for negated, exp_id in best]
