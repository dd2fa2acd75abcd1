"""The vector index: usearch HNSW (cosine, float16) over the live experiences, kept in step with the library.

The index is derived state. It is saved beside the ledger with the library generation it
reflects; at start-up an index that is missing, unreadable, for another model, or older than
the library is rebuilt from the library (with progress), so it never serves a deleted or
superseded version for long: updates follow every committed batch.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np
from usearch.index import Index

from ledger import codec
from ledger.cid import CID_LENGTH
from ledger.embedder import unpack_float16

log = logging.getLogger(__name__)

INDEX_FILE = "index.usearch"
META_FILE = "index.meta"


class ExperienceIndex:
    """usearch HNSW index whose keys map back to experience ids.

    Keys come from a local counter, never from the ids themselves: a key derived from a CID
    could be made to collide by anyone able to sign many operations.
    """

    def __init__(self, directory: Path, model: str, dim: int) -> None:
        self._directory = directory
        self._model = model
        self._dim = dim
        self._index = self._new()
        self._ids: dict[int, bytes] = {}
        self._key_of: dict[bytes, int] = {}
        self._version: dict[bytes, bytes] = {}  # experience id -> the version CID its vector comes from
        self._next_key = 0
        self.generation = -1

    def _new(self) -> Index:
        # expansion_add 64 (default 128) halves the cost of keeping the index in step with ingest;
        # recall@5 stays >= 0.99 on experience-like text at 100k (bench/bench_index.py)
        return Index(ndim=self._dim, metric="cos", dtype="f16", connectivity=16, expansion_add=64, expansion_search=64)

    def __len__(self) -> int:
        return len(self._ids)

    def ids(self) -> set[bytes]:
        return set(self._ids.values())

    def holds(self, exp_id: bytes, version: bytes) -> bool:
        """Whether the experience is indexed with the vector of that version."""
        return self._version.get(exp_id) == version

    def update(self, live: dict[bytes, tuple[bytes, bytes]], removals: Iterable[bytes]) -> None:
        """Apply one batch of changes; `live` maps experience id -> (version CID, float16 embedding).

        An experience already indexed at that version is left alone; the rest are added in one
        call, which usearch does far faster than one vector at a time.
        """
        for exp_id in removals:
            self.remove(exp_id)
        changed = {exp_id: item for exp_id, item in live.items() if self._version.get(exp_id) != item[0]}
        for exp_id in changed:
            self.remove(exp_id)
        if not changed:
            return
        keys = []
        for exp_id, (version, _) in changed.items():
            keys.append(self._assign(exp_id))
            self._version[exp_id] = version
        vectors = np.stack([unpack_float16(values) for _, values in changed.values()])
        self._index.add(np.array(keys, dtype=np.uint64), vectors)

    def _assign(self, exp_id: bytes) -> int:
        key, self._next_key = self._next_key, self._next_key + 1
        self._ids[key] = exp_id
        self._key_of[exp_id] = key
        return key

    def remove(self, exp_id: bytes) -> None:
        key = self._key_of.pop(exp_id, None)
        if key is not None:
            self._index.remove(key)
            del self._ids[key], self._version[exp_id]

    def search(self, vector: np.ndarray, count: int) -> list[tuple[bytes, float]]:
        """Up to `count` nearest experiences as (id, cosine similarity), best first."""
        if not self._ids or count <= 0:
            return []
        matches = self._index.search(np.asarray(vector, dtype=np.float32), min(count, len(self._ids)))
        return [
            (self._ids[int(key)], 1.0 - float(distance))
            for key, distance in zip(matches.keys, matches.distances, strict=True)
            if int(key) in self._ids
        ]

    def rebuild(
        self,
        live: Iterable[tuple[bytes, bytes]],
        total: int,
        generation: int,
        progress: Callable[[int, int], None] | None = None,
    ) -> None:
        """Index every (experience id, version CID, float16 embedding) from scratch."""
        self._index = self._new()
        self._ids = {}
        done = 0
        batch_keys: list[int] = []
        batch_vectors: list[np.ndarray] = []
        for exp_id, version, values in live:
            batch_keys.append(self._assign(exp_id))
            batch_vectors.append(unpack_float16(values))
            self._version[exp_id] = version
            if len(batch_keys) == 1000:
                self._index.add(np.array(batch_keys, dtype=np.uint64), np.stack(batch_vectors))
                done += len(batch_keys)
                batch_keys, batch_vectors = [], []
                if progress:
                    progress(done, total)
        if batch_keys:
            self._index.add(np.array(batch_keys, dtype=np.uint64), np.stack(batch_vectors))
            done += len(batch_keys)
        if progress:
            progress(done, total)
        self.generation = generation

    # --- persistence -----------------------------------------------------------------------

    def save(self) -> None:
        """Write index and key map atomically (temporary files, then rename)."""
        index_path, meta_path = self._directory / INDEX_FILE, self._directory / META_FILE
        self._index.save(str(index_path) + ".tmp")
        meta = {
            "model": self._model,
            "dim": self._dim,
            "generation": self.generation,
            "next_key": self._next_key,
            "entries": b"".join(
                key.to_bytes(8, "big") + exp_id + self._version[exp_id] for key, exp_id in self._ids.items()
            ),
        }
        (self._directory / (META_FILE + ".tmp")).write_bytes(codec.pack(meta))
        os.replace(str(index_path) + ".tmp", index_path)
        os.replace(str(meta_path) + ".tmp", meta_path)

    def load(self, generation: int) -> str | None:
        """Load the saved index; returns why it cannot be used (then it must be rebuilt), or None."""
        index_path, meta_path = self._directory / INDEX_FILE, self._directory / META_FILE
        if not index_path.exists() or not meta_path.exists():
            return "missing"
        try:
            meta = codec.unpack(meta_path.read_bytes())
            if (meta["model"], meta["dim"]) != (self._model, self._dim):
                return f"built for {meta['model']} ({meta['dim']}-d)"
            if meta["generation"] != generation:
                return f"stale (generation {meta['generation']}, library at {generation})"
            index = Index.restore(str(index_path))
            raw, width = meta["entries"], 8 + 2 * CID_LENGTH
            entries = [
                (
                    int.from_bytes(raw[i : i + 8], "big"),
                    raw[i + 8 : i + 8 + CID_LENGTH],
                    raw[i + 8 + CID_LENGTH : i + width],
                )
                for i in range(0, len(raw), width)
            ]
            if index is None or len(index) != len(entries) or any(not index.contains(key) for key, _, _ in entries):
                return "corrupt (keys disagree with the saved key map)"
        except Exception as exc:  # usearch and cbor2 raise various types on damaged files
            return f"unreadable ({type(exc).__name__}: {exc})"
        self._index, self.generation, self._next_key = index, generation, meta["next_key"]
        self._ids = {key: exp_id for key, exp_id, _ in entries}
        self._key_of = {exp_id: key for key, exp_id, _ in entries}
        self._version = {exp_id: version for _, exp_id, version in entries}
        return None
