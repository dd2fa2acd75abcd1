"""The node-local retrieval index: a local model's vectors of live experiences, persisted and searched exactly.

Derived state, like the vector index, but slow to build (a local model embeds ~170 texts/s here against
WordLlama's thousands), so it is kept across restarts and survives a crash: an append-only file of records
(experience id, version CID, float16 vector, CRC-32). A record torn by `kill -9` or a crash fails its CRC and
is cut off at the next start; everything before it is kept. A record stands for one version of an experience:
one whose version is no longer live (modified, deleted, merged away) is dropped from search by `retain` and
from the file by `compact`. The file names the model, so vectors of another model are never used.

Search is exact (float32 shortlist, float64 scores, ties by id: `ExactVectors`), so two nodes holding the same
vectors answer the same whatever order they embedded them in.
"""

from __future__ import annotations

import logging
import os
import struct
import threading
import zlib
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import BinaryIO

import numpy as np

from ledger.cid import CID, CID_LENGTH
from ledger.index import ExactVectors
from ledger.ledger import Ledger
from ledger.local_model import RetrievalModel

log = logging.getLogger(__name__)

_MAGIC = b"expledger-local-index-v1\n"
_CRC = struct.Struct(">I")
_STEP_CHUNK = 16  # texts embedded between checks for a stop (~0.2 s with MiniLM)


class LocalIndex:
    """Vectors of one local model, keyed by experience id, each for one version; thread-safe."""

    def __init__(self, directory: Path, model: str, dim: int) -> None:
        self.model = model
        self.dim = dim
        self.path = Path(directory) / f"local-index-{model}.bin"
        self._record = 2 * CID_LENGTH + 2 * dim
        self._lock = threading.Lock()
        self._version: dict[bytes, bytes] = {}  # experience id -> the version its vector comes from
        self._rows = ExactVectors(dim)
        self._stored = 0  # records in the file (superseded ones included): compaction's measure
        self._file = self._open()

    def _header(self) -> bytes:
        return _MAGIC + f"{self.model} {self.dim}\n".encode()

    def _open(self) -> BinaryIO:
        """Read every intact record, cut off a torn or damaged tail, and open the file for appending."""
        header = self._header()
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            data = b""
        if not data.startswith(header):
            if data:
                log.warning("%s: not an index of %s (%d-d): starting afresh", self.path, self.model, self.dim)
            self.path.parent.mkdir(parents=True, exist_ok=True)
            _write_atomically(self.path, header)
            return self._appender()
        records, end = self._records(data)
        if end < len(data):
            log.warning("%s: cut %d bytes of a torn or damaged record at %d", self.path, len(data) - end, end)
            with open(self.path, "r+b") as handle:
                handle.truncate(end)
        self._stored = len(records)
        latest = {exp_id: (version, packed) for exp_id, version, packed in records}
        if latest:
            ids = sorted(latest)
            self._version = {exp_id: latest[exp_id][0] for exp_id in ids}
            vectors = np.frombuffer(b"".join(latest[exp_id][1] for exp_id in ids), dtype="<f2").reshape(-1, self.dim)
            self._rows.add(ids, vectors.astype(np.float32))
        return self._appender()

    def _appender(self) -> BinaryIO:
        """The file opened for appending records, held open until `close`."""
        return open(self.path, "ab")

    def _records(self, data: bytes) -> tuple[list[tuple[bytes, bytes, bytes]], int]:
        """The intact records of a file's bytes, in order, and where the last one ends."""
        size, offset, records = self._record + _CRC.size, len(self._header()), []
        while offset + size <= len(data):
            body = data[offset : offset + self._record]
            if _CRC.unpack_from(data, offset + self._record)[0] != zlib.crc32(body):
                break
            records.append((body[:CID_LENGTH], body[CID_LENGTH : 2 * CID_LENGTH], body[2 * CID_LENGTH :]))
            offset += size
        return records, offset

    def close(self) -> None:
        with self._lock:
            self._file.close()

    def __len__(self) -> int:
        with self._lock:
            return len(self._version)

    def versions(self) -> dict[bytes, bytes]:
        """Each embedded experience id with the version its vector comes from."""
        with self._lock:
            return dict(self._version)

    def holds(self, exp_id: bytes, version: bytes) -> bool:
        with self._lock:
            return self._version.get(exp_id) == version

    def add(self, items: Iterable[tuple[bytes, bytes, np.ndarray]]) -> None:
        """Store (experience id, version CID, vector) and make them searchable; written before they are searched.

        Vectors are kept as float16, as stored, so a vector found in memory and one read back agree exactly.
        """
        with self._lock:
            records, ids, rows = [], [], []
            for exp_id, version, vector in items:
                packed = np.asarray(vector, dtype="<f2").tobytes()
                body = exp_id + version + packed
                records.append(body + _CRC.pack(zlib.crc32(body)))
                if exp_id in self._version:
                    self._rows.remove(exp_id)
                self._version[exp_id] = version
                ids.append(exp_id)
                rows.append(np.frombuffer(packed, dtype="<f2"))
            if not records:
                return
            self._file.write(b"".join(records))
            self._file.flush()  # in the kernel: a killed process loses nothing written so far
            self._stored += len(records)
            self._rows.add(ids, np.stack(rows).astype(np.float32))

    def retain(self, live: dict[bytes, bytes]) -> int:
        """Drop from search every experience not live at the version it was embedded for; how many were dropped."""
        with self._lock:
            stale = [exp_id for exp_id, version in self._version.items() if live.get(exp_id) != version]
            for exp_id in stale:
                del self._version[exp_id]
                self._rows.remove(exp_id)
            return len(stale)

    def compact(self) -> bool:
        """Rewrite the file with only the current records when more than half of it is superseded.

        The records are copied byte for byte: a compacted index holds exactly the vectors it held.
        """
        with self._lock:
            if self._stored <= 2 * len(self._version) + 1024:
                return False
            self._file.flush()
            records, _ = self._records(self.path.read_bytes())
            current = {
                exp_id: exp_id + version + packed
                for exp_id, version, packed in records
                if self._version.get(exp_id) == version
            }
            parts = [self._header()]
            parts += [current[exp_id] + _CRC.pack(zlib.crc32(current[exp_id])) for exp_id in sorted(current)]
            self._file.close()
            _write_atomically(self.path, b"".join(parts))
            self._stored = len(current)
            self._file = self._appender()
            return True

    def vector(self, exp_id: bytes, version: bytes) -> np.ndarray | None:
        """The vector of that version of the experience, if embedded."""
        with self._lock:
            return self._rows.vector(exp_id) if self._version.get(exp_id) == version else None

    def search(self, query: np.ndarray, count: int) -> list[tuple[bytes, float]]:
        """Up to `count` (experience id, cosine) best first, ties by id; the caller checks each against its view."""
        with self._lock:
            if not self._version or count <= 0:
                return []
            return self._rows.search(np.asarray(query, dtype=np.float32), min(count, len(self._version)))


def _write_atomically(path: Path, data: bytes) -> None:
    temporary = path.with_name(path.name + ".tmp")
    with open(temporary, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)


class LocalRetrieval:
    """A local model with its index, and the step that embeds what the index lacks (run by a background task)."""

    def __init__(self, ledger: Ledger, model: RetrievalModel) -> None:
        self.ledger = ledger
        self.model = model
        self.index = LocalIndex(ledger.data_dir, model.name, model.dim)
        #: live experiences and how many of them lack a vector, as of the last step (for `status`)
        self.live = 0
        self.missing = 0

    def close(self) -> None:
        self.index.close()

    def embed(self, items: list[tuple[bytes, bytes, str]]) -> dict[bytes, np.ndarray]:
        """Embed (experience id, version, text) and store the vectors: the index's vector of each id."""
        if not items:
            return {}
        vectors = self.model.embed_experiences([text for _, _, text in items])
        self.index.add((exp_id, version, vector) for (exp_id, version, _), vector in zip(items, vectors, strict=True))
        return {exp_id: vector for (exp_id, _, _), vector in zip(items, vectors, strict=True)}

    def step(self, most: int = 256, stop: Callable[[], bool] = lambda: False) -> int:
        """Embed up to `most` live experiences that lack a vector (in id order); how many were embedded.

        Versions no longer live leave search first; once nothing is missing, a mostly superseded file is compacted.
        """
        live = self.ledger.indexed()
        self.index.retain(live)
        held = self.index.versions()
        missing = sorted(exp_id for exp_id, version in live.items() if held.get(exp_id) != version)
        self.live, self.missing = len(live), len(missing)
        if not missing:
            self.index.compact()
            return 0
        view = self.ledger.view()
        done = 0
        for start in range(0, min(most, len(missing)), _STEP_CHUNK):
            if stop():
                break
            items = []
            for exp_id in missing[start : min(most, start + _STEP_CHUNK)]:
                record = view.experience(CID(exp_id))
                if record is not None and record.live and record.version.raw == live[exp_id]:
                    items.append((exp_id, live[exp_id], view.content(record.version).text))
            self.embed(items)
            done += len(items)
            self.missing = max(0, self.missing - len(items))
        return done

    def progress(self, catch_up: int = 0) -> dict[str, object]:
        """The model, its threshold, live experiences and how many lack a vector, counted now. A backlog of at
        most `catch_up` is embedded first, as a query would (so a node that is nearly done reports done)."""
        if catch_up:
            live = self.ledger.indexed()
            held = self.index.versions()
            if sum(1 for exp_id, version in live.items() if held.get(exp_id) != version) <= catch_up:
                self.step(catch_up)
        live = self.ledger.indexed()
        held = self.index.versions()
        missing = sum(1 for exp_id, version in live.items() if held.get(exp_id) != version)
        return {"model": self.model.name, "threshold": self.model.threshold, "live": len(live), "missing": missing}
