"""The materialized library: a deterministic fold of the applied operations in canonical order.

Canonical order is (Lamport clock, binary CID). The library is the result of folding every
applied operation in that order with the rules of docs/PROTOCOL.md §7, so it depends only on the
SET of operations. Each fold step records how to undo itself; an operation that arrives late and
sorts before already-folded ones undoes the tail, takes its place, and folds the tail again.
"""

from __future__ import annotations

import operator
import struct
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from ledger import codec
from ledger.cid import CID, CID_LENGTH
from ledger.embedder import unit, unpack_float16
from ledger.ops import Experience, Kind, Operation, load_stored
from ledger.params import NetworkParams
from ledger.store import (
    BLOCK,
    BY_DOMAIN,
    BY_TARGET,
    EXPERIENCE,
    OPMETA,
    ORDER,
    STATUS,
    UNDO,
    VOTES,
    Store,
    Transaction,
    u64,
)

_KINDS = list(Kind)
_META_HEAD = struct.Struct(">QBBB")
_META_CACHE_LIMIT = 200_000
#: the float32 pre-filter may not drop a true near-duplicate: its error is far below this margin
_PREFILTER_MARGIN = 1e-3
#: near-duplicate candidates are scored this many adds at a time
_CHUNK = 64


@dataclass(frozen=True, slots=True)
class OpMeta:
    """What causality needs of an operation, stored compactly beside its block."""

    clock: int
    kind: Kind
    parents: tuple[bytes, ...]
    targets: tuple[bytes, ...]

    @classmethod
    def of(cls, op: Operation) -> OpMeta:
        targets = op.targets if op.kind is Kind.MERGE else ((op.target,) if op.target is not None else ())
        return cls(op.clock, op.kind, tuple(p.raw for p in op.parents), tuple(t.raw for t in targets))

    def encode(self) -> bytes:
        head = _META_HEAD.pack(self.clock, _KINDS.index(self.kind), len(self.parents), len(self.targets))
        return head + b"".join(self.parents) + b"".join(self.targets)

    @classmethod
    def decode(cls, raw: bytes) -> OpMeta:
        clock, kind, n_parents, n_targets = _META_HEAD.unpack_from(raw)
        links = raw[_META_HEAD.size :]
        cut = n_parents * CID_LENGTH
        parents = tuple(links[i : i + CID_LENGTH] for i in range(0, cut, CID_LENGTH))
        targets = tuple(links[i : i + CID_LENGTH] for i in range(cut, cut + n_targets * CID_LENGTH, CID_LENGTH))
        return cls(clock, _KINDS[kind], parents, targets)


def order_key(clock: int, cid_raw: bytes) -> bytes:
    return u64(clock) + cid_raw


def exact_cosine_exceeds(a: bytes, b: bytes, threshold: Fraction) -> bool:
    """cos(a, b) > threshold for float16 vectors, decided exactly with integers (identical on every machine).

    Every float16 is an integer multiple of 2^-24, so scaled values, their dot product and norms
    are exact integers; cos > p/q  <=>  dot > 0 and q²·dot² > p²·|a|²·|b|² (for p/q >= 0).
    """
    scale = float(1 << 24)
    ints_a = (np.frombuffer(a, dtype="<f2").astype(np.float64) * scale).astype(np.int64).tolist()
    ints_b = (np.frombuffer(b, dtype="<f2").astype(np.float64) * scale).astype(np.int64).tolist()
    dot = sum(map(operator.mul, ints_a, ints_b))
    if dot <= 0:
        return False
    norm_a = sum(x * x for x in ints_a)
    norm_b = sum(x * x for x in ints_b)
    p, q = threshold.numerator, threshold.denominator
    return q * q * dot * dot > p * p * norm_a * norm_b


class _LiveVectors:
    """Unit float32 vectors of live experiences, to pre-filter near-duplicate candidates.

    The filter may let through vectors that are not near-duplicates (the exact test decides),
    but never drops one. `_prepare` scores a whole batch of new vectors in one matrix product
    (far faster than one product per vector); rows changed since then are scored one by one.
    """

    def __init__(self, dim: int) -> None:
        self._matrix = np.zeros((1024, dim), dtype=np.float32)
        self._row: dict[bytes, int] = {}
        self._ids: list[bytes | None] = []
        self._free: list[int] = []
        self.raw: dict[bytes, bytes] = {}
        self.version: dict[bytes, bytes] = {}
        self._plan: list[tuple[bytes, bytes]] = []
        self._plan_index: dict[bytes, int] = {}
        self._prepared: dict[bytes, int] = {}
        self._scores = np.zeros((0, 0), dtype=np.float32)
        self._scored_ids: list[bytes | None] = []
        self._changed: set[bytes] = set()

    def set(self, exp_id: bytes, version: bytes, values: bytes) -> None:
        row = self._row.get(exp_id)
        if row is None:
            row = self._free.pop() if self._free else len(self._ids)
            if row == len(self._ids):
                self._ids.append(None)
            if row >= len(self._matrix):
                self._matrix = np.vstack([self._matrix, np.zeros_like(self._matrix)])
            self._row[exp_id] = row
            self._ids[row] = exp_id
        self._matrix[row] = unit(unpack_float16(values))
        self.raw[exp_id] = values
        self.version[exp_id] = version
        self._changed.add(exp_id)

    def remove(self, exp_id: bytes) -> None:
        row = self._row.pop(exp_id, None)
        if row is not None:
            self._matrix[row] = 0.0
            self._ids[row] = None
            self._free.append(row)
            del self.raw[exp_id], self.version[exp_id]
            self._changed.add(exp_id)

    def plan(self, upcoming: list[tuple[bytes, bytes]]) -> None:
        """The adds the fold will meet, in order (key, float16 values); they are scored in chunks."""
        self._plan = upcoming
        self._plan_index = {key: index for index, (key, _) in enumerate(upcoming)}
        self._prepared = {}

    def _prepare(self, batch: dict[bytes, bytes]) -> None:
        """Score the vectors `batch` (key -> float16 values, not empty) against every live row at once."""
        self._prepared = {key: column for column, key in enumerate(batch)}
        queries = np.stack([unit(unpack_float16(values)) for values in batch.values()])
        self._scores = self._matrix[: len(self._ids)] @ queries.T
        self._scored_ids = list(self._ids)
        self._changed = set()

    def candidates(self, values: bytes, threshold: float, key: bytes) -> list[bytes]:
        floor = threshold - _PREFILTER_MARGIN
        if key not in self._prepared and key in self._plan_index:
            # a small chunk keeps the rows changed since scoring (checked one by one) few
            start = self._plan_index[key]
            self._prepare(dict(self._plan[start : start + _CHUNK]))
        column = self._prepared.get(key)
        if column is None:
            scores = self._matrix[: len(self._ids)] @ unit(unpack_float16(values))
            return [exp_id for row in np.nonzero(scores > floor)[0].tolist() if (exp_id := self._ids[row]) is not None]
        rows = np.nonzero(self._scores[:, column] > floor)[0].tolist()
        found = [
            exp_id
            for row in rows
            if (exp_id := self._scored_ids[row]) is not None and exp_id not in self._changed and exp_id in self._row
        ]
        changed = [exp_id for exp_id in self._changed if exp_id in self._row]
        if changed:
            scores = self._matrix[[self._row[exp_id] for exp_id in changed]] @ unit(unpack_float16(values))
            found.extend(exp_id for exp_id, score in zip(changed, scores.tolist(), strict=True) if score > floor)
        return found


class _Step:
    """The writes of one fold step, remembering each key's previous value so the step can be undone.

    Reads are cached for the step, so a key read by the rules costs nothing more when the step
    writes it and must remember its old value.
    """

    def __init__(self, library: Library, txn: Transaction) -> None:
        self._library = library
        self._txn = txn
        self.undo: list[list[bytes | None]] = []
        self._touched: set[bytes] = set()
        self._raw: dict[bytes, bytes | None] = {}
        self._records: dict[bytes, dict[str, Any] | None] = {}

    def get(self, key: bytes) -> bytes | None:
        if key not in self._raw:
            self._raw[key] = self._txn.get(key)
        return self._raw[key]

    def record(self, exp_id: bytes) -> dict[str, Any] | None:
        """The experience record as this step last wrote it; a copy the caller may change and put back."""
        if exp_id not in self._records:
            raw = self.get(EXPERIENCE + exp_id)
            self._records[exp_id] = codec.unpack(raw) if raw is not None else None
        found = self._records[exp_id]
        return dict(found) if found is not None else None

    def put_record(self, record: dict[str, Any]) -> dict[str, Any] | None:
        """Write `record`; returns the previous version (to maintain the domain index)."""
        exp_id = record["id"].raw
        self.record(exp_id)
        old = self._records[exp_id]
        self._records[exp_id] = record
        self.put(EXPERIENCE + exp_id, codec.pack(record), record)
        return old

    def scan(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        return self._txn.scan(prefix)

    def put(self, key: bytes, value: bytes | None, record: dict[str, Any] | None = None) -> None:
        if key not in self._touched:
            self._touched.add(key)
            self.undo.append([key, self.get(key)])
        self._raw[key] = value
        self._library.write_state(self._txn, key, value, record)


def _sorted_cids(raws: Iterable[bytes]) -> list[CID]:
    return [CID(raw) for raw in sorted(set(raws))]


class Library:
    """Folds applied operations into experience records (table X), statuses (V) and the domain index (D)."""

    def __init__(self, store: Store, params: NetworkParams) -> None:
        self._store = store
        self._params = params
        self._threshold = Fraction(params.near_duplicate_cosine)
        self._meta: dict[bytes, OpMeta] = {}
        self._vectors: _LiveVectors | None = None
        self._folding: dict[bytes, Operation] = {}  # the new operations of the current apply()
        self.touched: set[bytes] = set()  # experiences whose record changed since the ledger last looked
        self.refolded = 0  # operations folded again because a late one sorted before them

    # --- reading -----------------------------------------------------------------------------

    def meta(self, view: Store | Transaction, cid_raw: bytes) -> OpMeta:
        found = self._meta.get(cid_raw)
        if found is None:
            raw = view.get(OPMETA + cid_raw)
            if raw is None:
                raise KeyError(f"no operation {CID(cid_raw)}")
            found = OpMeta.decode(raw)
            if len(self._meta) >= _META_CACHE_LIMIT:
                self._meta.clear()
            self._meta[cid_raw] = found
        return found

    @staticmethod
    def record(view: Store | Transaction, exp_id: bytes) -> dict[str, Any] | None:
        raw = view.get(EXPERIENCE + exp_id)
        return codec.unpack(raw) if raw is not None else None

    def content(self, view: Store | Transaction, op_cid: bytes) -> Experience:
        """The experience an add, modify or merge carries (operations being folded come from memory)."""
        op = self._folding.get(op_cid) or load_stored(view.get(BLOCK + op_cid))
        assert op.content is not None
        return op.content

    def resolve(self, view: Store | Transaction | _Step, exp_id: bytes) -> bytes:
        """Follow aliases (merged or absorbed experiences) to the experience that stands for them."""
        read = view.record if isinstance(view, _Step) else lambda key: self.record(view, key)
        record = read(exp_id)
        while record is not None and record["status"] == "alias":
            exp_id = record["alias_of"].raw
            record = read(exp_id)
        return exp_id

    def experiences(self) -> Iterator[dict[str, Any]]:
        for _, raw in self._store.scan(EXPERIENCE):
            yield codec.unpack(raw)

    def snapshot(self) -> bytes:
        """Every experience record and operation status, canonically encoded: equal bytes, equal library."""
        statuses = [[CID(key[1:]), codec.unpack(raw)] for key, raw in self._store.scan(STATUS)]
        votes = [
            [CID(key[1 : 1 + CID_LENGTH]), key[1 + CID_LENGTH :].decode(), codec.unpack(raw)]
            for key, raw in self._store.scan(VOTES)
        ]
        return codec.encode({"experiences": list(self.experiences()), "statuses": statuses, "votes": votes})

    def votes(self, exp_id: bytes) -> dict[str, list[Any]]:
        """Each author's counted vote on an experience: [clock, CID, value]."""
        return {key[1 + CID_LENGTH :].decode(): codec.unpack(raw) for key, raw in self._store.scan(VOTES + exp_id)}

    def is_ancestor(self, view: Store | Transaction, ancestor: bytes, descendant: bytes) -> bool:
        """Whether `ancestor` is reachable from `descendant` through parent links."""
        return ancestor in self.ancestors_among(view, [ancestor], descendant)

    def ancestors_among(self, view: Store | Transaction, candidates: list[bytes], descendant: bytes) -> set[bytes]:
        """Which `candidates` are ancestors of `descendant` (§7.2: reachable through parent links,
        walking only through operations whose clock exceeds the candidate's).

        Direct parents, the usual case, cost one lookup; the others are walked one by one, each
        with its own clock floor, as the definition says.
        """
        parents = self.meta(view, descendant).parents
        found = set(candidates).intersection(parents)
        for candidate in set(candidates) - found:
            floor = self.meta(view, candidate).clock
            stack = list(parents)
            seen: set[bytes] = set()
            while stack:
                parent = stack.pop()
                if parent == candidate:
                    found.add(candidate)
                    break
                if parent in seen:
                    continue
                seen.add(parent)
                meta = self.meta(view, parent)
                if meta.clock > floor:
                    stack.extend(meta.parents)
        return found

    # --- writing -----------------------------------------------------------------------------

    def reset(self, empty: bool = False) -> None:
        """Drop in-memory state after a transaction that did not commit (`empty`: for a rebuild from nothing)."""
        self._vectors = _LiveVectors(self._params.embedding_dim) if empty else None
        self._folding = {}
        self.touched.clear()

    def _live_vectors(self) -> _LiveVectors:
        if self._vectors is None:
            vectors = _LiveVectors(self._params.embedding_dim)
            for record in self.experiences():
                if record["status"] == "live":
                    version = record["version"].raw
                    vectors.set(record["id"].raw, version, self.content(self._store, version).embedding.values)
            self._vectors = vectors
        return self._vectors

    def write_state(
        self, txn: Transaction, key: bytes, value: bytes | None, record: dict[str, Any] | None = None
    ) -> None:
        """Every write to fold state goes here, so the live vectors follow the experience records."""
        txn.put(key, value)
        if key[:1] != EXPERIENCE:
            return
        self.touched.add(key[1:])
        if self._vectors is not None:
            if record is None and value is not None:
                record = codec.unpack(value)
            if record is not None and record["status"] == "live":
                version = record["version"].raw
                if self._vectors.version.get(key[1:]) != version:
                    self._vectors.set(key[1:], version, self.content(txn, version).embedding.values)
            else:
                self._vectors.remove(key[1:])

    def apply(
        self,
        txn: Transaction,
        ready: list[tuple[bytes, Operation]],
        progress: Callable[[int, int], None] | None = None,
    ) -> None:
        """Fold newly applied operations; refold the tail when one sorts before already-folded ones.

        `progress(done, total)` is called every 10,000 folded operations (long rebuilds).
        """
        if not ready:
            return
        self._live_vectors()  # built from committed state, before this transaction changes any record
        self._folding = dict(ready)
        new_keys: dict[bytes, Operation] = {}
        start = None
        for cid_raw, op in ready:
            key = order_key(op.clock, cid_raw)
            meta = self.meta(txn, cid_raw)
            for target in meta.targets:
                txn.put(BY_TARGET + target + key, bytes([_KINDS.index(op.kind)]))
            void = self.clock_void(txn, meta)
            if void is not None:
                # void wherever it sorts and read by no rule: record it in place, refold nothing
                txn.put(ORDER + key, b"")
                txn.put(UNDO + cid_raw, codec.pack([[STATUS + cid_raw, txn.get(STATUS + cid_raw)]]))
                txn.put(STATUS + cid_raw, codec.pack(void))
                continue
            new_keys[key] = op
            start = key if start is None or key < start else start
        if start is None:
            self._folding = {}
            return
        for key, op in new_keys.items():
            if op.kind in (Kind.DELETE, Kind.MODIFY):
                assert op.target is not None
                for merge_key in self._merges_naming(txn, op.target.raw):
                    # a merge folded earlier must be folded again unless this operation saw it
                    if merge_key < start and not self.is_ancestor(txn, merge_key[8:], key[8:]):
                        start = merge_key
        tail = [key[1:] for key, _ in txn.scan(ORDER, ORDER + start)]
        self.refolded += len(tail)
        for key in reversed(tail):
            self._undo(txn, key[8:])
        for key in new_keys:
            txn.put(ORDER + key, b"")
        self._live_vectors().plan(
            [
                (key[8:], op.content.embedding.values)
                for key, op in sorted(new_keys.items())
                if op.kind is Kind.ADD and op.content
            ]
        )
        order = sorted([*tail, *new_keys])
        for done, key in enumerate(order, 1):
            self._fold(txn, key[8:], new_keys.get(key))
            if progress and done % 10_000 == 0:
                progress(done, len(order))
        self._folding = {}

    def _merges_naming(self, txn: Transaction, target: bytes) -> Iterator[bytes]:
        merge = bytes([_KINDS.index(Kind.MERGE)])
        for key, kind in txn.scan(BY_TARGET + target):
            if kind == merge:
                yield key[1 + CID_LENGTH :]

    def _undo(self, txn: Transaction, cid_raw: bytes) -> None:
        undo = codec.unpack(txn.get(UNDO + cid_raw))
        for key, old in reversed(undo):
            self.write_state(txn, key, old)
        txn.delete(UNDO + cid_raw)

    def _fold(self, txn: Transaction, cid_raw: bytes, op: Operation | None) -> None:
        if op is None:
            op = load_stored(txn.get(BLOCK + cid_raw))
        step = _Step(self, txn)
        outcome = self._rule(step, cid_raw, op)
        step.put(STATUS + cid_raw, codec.pack(outcome))
        txn.put(UNDO + cid_raw, codec.pack(step.undo))

    # --- the rules (docs/PROTOCOL.md §7) -------------------------------------------------------

    def clock_void(self, view: Store | Transaction | _Step, meta: OpMeta) -> dict[str, Any] | None:
        """The void outcome of an operation whose clock does not exceed its parents' or targets' (§7.4)."""
        if any(self.meta(view, parent).clock >= meta.clock for parent in meta.parents):
            return _void("clock.parent", "its clock does not exceed every parent's")
        if any(self.meta(view, target).clock >= meta.clock for target in meta.targets):
            return _void("clock.target", "its clock does not exceed its target's")
        return None

    def _rule(self, step: _Step, cid: bytes, op: Operation) -> dict[str, Any]:
        meta = self.meta(step, cid)
        void = self.clock_void(step, meta)
        if void is not None:
            return void
        for target in meta.targets:
            if step.get(EXPERIENCE + target) is None:
                return _void("target.not_experience", f"target {CID(target)} did not create an experience")
        if op.kind is Kind.ADD:
            return self._add(step, cid, op)
        if op.kind is Kind.MERGE:
            return self._merge(step, cid, op, meta)
        exp_id = self.resolve(step, meta.targets[0])
        record = step.record(exp_id)
        assert record is not None
        if op.kind is Kind.MODIFY:
            return self._modify(step, cid, record)
        if op.kind is Kind.DELETE:
            record["status"] = "deleted"
            record["deleted_by"] = _sorted_cids([*(c.raw for c in record["deleted_by"]), cid])
            self._put_experience(step, record)
            return _applied(exp_id)
        assert op.vote is not None
        self._vote(step, record, op.author, [op.clock, CID(cid), op.vote])
        self._put_experience(step, record)
        return _applied(exp_id)

    @staticmethod
    def _vote(step: _Step, record: dict[str, Any], author: str, vote: list[Any]) -> None:
        """Count `vote` for `record` if it is the author's latest (by clock, then CID)."""
        key = VOTES + record["id"].raw + author.encode()
        raw = step.get(key)
        current = codec.unpack(raw) if raw is not None else None
        if current is not None and (vote[0], vote[1].raw) <= (current[0], current[1].raw):
            return
        if current is not None:
            record["up" if current[2] > 0 else "down"] -= 1
        record["up" if vote[2] > 0 else "down"] += 1
        step.put(key, codec.pack(vote))

    def _add(self, step: _Step, cid: bytes, op: Operation) -> dict[str, Any]:
        assert op.content is not None
        record = _new_record(cid, op, support=1)
        similar = self._earliest_similar(step, cid, op.content.embedding.values)
        if similar is None:
            self._put_experience(step, record)
            return _applied(cid)
        into = step.record(similar)
        assert into is not None
        into["support"] += 1
        into["absorbed"] = _sorted_cids([*(c.raw for c in into["absorbed"]), cid])
        record["status"], record["alias_of"] = "alias", CID(similar)
        self._put_experience(step, into)
        self._put_experience(step, record)
        return {"outcome": "absorbed", "into": CID(similar)}

    def _earliest_similar(self, step: _Step, cid: bytes, values: bytes) -> bytes | None:
        """The canonically earliest live experience with exact cosine above the near-duplicate threshold."""
        vectors = self._live_vectors()
        best: tuple[int, bytes] | None = None
        for exp_id in vectors.candidates(values, float(self._threshold), cid):
            if exact_cosine_exceeds(values, vectors.raw[exp_id], self._threshold):
                record = step.record(exp_id)
                assert record is not None
                rank = (record["clock"], exp_id)
                best = rank if best is None or rank < best else best
        return best[1] if best else None

    def _modify(self, step: _Step, cid: bytes, record: dict[str, Any]) -> dict[str, Any]:
        if record["status"] == "deleted":
            return _void("superseded.deleted", "its experience was deleted (delete beats modify)")
        old_heads = [h.raw for h in record["heads"]]
        seen = self.ancestors_among(step, old_heads, cid) if old_heads else set()
        heads = [head for head in old_heads if head not in seen] + [cid]
        winner = min(heads, key=lambda head: (-self.meta(step, head).clock, head))
        record["heads"] = _sorted_cids(heads)
        record["version"] = CID(winner)
        record["domain"] = ".".join(self.content(step, winner).domain)
        self._put_experience(step, record)
        return _applied(record["id"].raw)

    def _merge(self, step: _Step, cid: bytes, op: Operation, meta: OpMeta) -> dict[str, Any]:
        delete, modify = bytes([_KINDS.index(Kind.DELETE)]), bytes([_KINDS.index(Kind.MODIFY)])
        for target in meta.targets:
            for key, kind in step.scan(BY_TARGET + target):
                other = key[1 + CID_LENGTH + 8 :]
                if self.clock_void(step, self.meta(step, other)) is not None:
                    continue  # void by its clock: it acts on nothing, not even a merge
                if kind == delete and not self.is_ancestor(step, cid, other):
                    return _void("merge.concurrent_delete", f"{CID(other)} deletes a source (delete beats merge)")
                if kind == modify and not self.is_ancestor(step, other, cid) and not self.is_ancestor(step, cid, other):
                    return _void("merge.concurrent_modify", f"{CID(other)} modifies a source (modify beats merge)")
        roots = sorted({self.resolve(step, target) for target in meta.targets})
        sources = [step.record(root) for root in roots]
        if any(source is None or source["status"] == "deleted" for source in sources):
            return _void("merge.target_deleted", "a source was deleted before the merge")
        record = _new_record(cid, op, support=sum(source["support"] for source in sources if source))
        record["absorbed"] = _sorted_cids(roots)
        for root in roots:  # every author's latest vote on any source counts for the merged experience
            for key, raw in step.scan(VOTES + root):
                self._vote(step, record, key[1 + CID_LENGTH :].decode(), codec.unpack(raw))
        for source in sources:
            assert source is not None
            source["status"], source["alias_of"] = "alias", CID(cid)
            self._put_experience(step, source)
        self._put_experience(step, record)
        return _applied(cid)

    @staticmethod
    def _put_experience(step: _Step, record: dict[str, Any]) -> None:
        exp_id = record["id"].raw
        old = step.put_record(record)
        was = BY_DOMAIN + old["domain"].encode() + b"\x00" + exp_id if old and old["status"] == "live" else None
        now = BY_DOMAIN + record["domain"].encode() + b"\x00" + exp_id if record["status"] == "live" else None
        if was != now:
            if was is not None:
                step.put(was, None)
            if now is not None:
                step.put(now, b"")


def _new_record(cid: bytes, op: Operation, support: int) -> dict[str, Any]:
    assert op.content is not None
    return {
        "id": CID(cid),
        "created_by": op.author,
        "clock": op.clock,
        "status": "live",
        "alias_of": None,
        "version": CID(cid),
        "heads": [],
        "domain": ".".join(op.content.domain),
        "support": support,
        "absorbed": [],
        "deleted_by": [],
        "up": 0,
        "down": 0,
    }


def _applied(exp_id: bytes) -> dict[str, Any]:
    return {"outcome": "applied", "experience": CID(exp_id)}


def _void(code: str, reason: str) -> dict[str, Any]:
    return {"outcome": "void", "code": code, "reason": reason}
