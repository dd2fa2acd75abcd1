"""The materialized library: a deterministic fold of the applied operations in canonical order.

Canonical order is (Lamport clock, binary CID). The library is the result of folding every
applied operation in that order with the rules of docs/PROTOCOL.md §7, so it depends only on the
SET of operations. Each fold step records how to undo itself; an operation that arrives late and
sorts before already-folded ones undoes the tail, takes its place, and folds the tail again.

The library owns its tables (X experiences, D by domain, V statuses, U undo, O order, T by
target, Y votes). Reading takes any `ReadView`; folding writes into the batch's transaction and
keeps every in-memory change in a `Fold` that the ledger publishes only after the batch commits.
"""

from __future__ import annotations

import operator
import struct
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from ledger import codec
from ledger.cid import CID, CID_LENGTH
from ledger.embedder import unit, unpack_float16
from ledger.ops import Experience, Kind, Operation, load_stored
from ledger.params import NetworkParams
from ledger.records import ExperienceRecord, Life, OpStatus, Outcome, Vote
from ledger.store import (
    BY_DOMAIN,
    BY_TARGET,
    EXPERIENCE,
    ORDER,
    STATUS,
    UNDO,
    VOTES,
    ReadView,
    Transaction,
    block_key,
    by_domain_key,
    by_domain_prefix,
    by_target_key,
    by_target_prefix,
    cid_of_key,
    experience_key,
    is_experience_key,
    opmeta_key,
    order_cid,
    order_key,
    ordered_key,
    parse_by_domain_key,
    parse_by_target_key,
    parse_ordered_key,
    parse_votes_key,
    status_key,
    undo_key,
    votes_key,
    votes_prefix,
)

_KINDS = list(Kind)
_META_HEAD = struct.Struct(">QBBB")
_META_CACHE_LIMIT = 200_000
#: the float32 pre-filter may not drop a true near-duplicate: its error is far below this margin
_PREFILTER_MARGIN = 1e-3
#: near-duplicate candidates are scored this many adds at a time
_CHUNK = 64
#: the tables the fold writes; a rebuild clears them
TABLES = (EXPERIENCE, BY_DOMAIN, STATUS, UNDO, ORDER, BY_TARGET, VOTES)


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

    @property
    def dependencies(self) -> list[bytes]:
        """Parents and targets, each once: an operation applies when all of them have."""
        return list(dict.fromkeys(self.parents + self.targets))


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


class _Rows:
    """A growable float32 matrix of unit vectors with one row per experience id (freed rows reused)."""

    def __init__(self, dim: int) -> None:
        self.matrix = np.zeros((1024, dim), dtype=np.float32)
        self.row: dict[bytes, int] = {}
        self.ids: list[bytes | None] = []
        self._free: list[int] = []

    def set(self, exp_id: bytes, vector: np.ndarray) -> None:
        row = self.row.get(exp_id)
        if row is None:
            row = self._free.pop() if self._free else len(self.ids)
            if row == len(self.ids):
                self.ids.append(None)
            if row >= len(self.matrix):
                self.matrix = np.vstack([self.matrix, np.zeros_like(self.matrix)])
            self.row[exp_id] = row
            self.ids[row] = exp_id
        self.matrix[row] = vector

    def remove(self, exp_id: bytes) -> None:
        row = self.row.pop(exp_id, None)
        if row is not None:
            self.matrix[row] = 0.0
            self.ids[row] = None
            self._free.append(row)

    def above(self, scores: np.ndarray, floor: float) -> list[bytes]:
        """The ids of rows whose score exceeds `floor`."""
        return [exp_id for row in np.nonzero(scores > floor)[0].tolist() if (exp_id := self.ids[row]) is not None]

    def scores(self, queries: np.ndarray) -> np.ndarray:
        return self.matrix[: len(self.ids)] @ queries


class LiveVectors:
    """Unit float32 vectors of the committed live experiences, to pre-filter near-duplicate candidates.

    Changed only by `Library.publish` after a batch commits; a fold sees its own changes through
    its `_VectorOverlay`. The filter may let through vectors that are not near-duplicates (the
    exact test decides), but never drops one.
    """

    def __init__(self, dim: int) -> None:
        self.rows = _Rows(dim)
        self.raw: dict[bytes, bytes] = {}  # experience id -> float16 values of its visible version
        self.version: dict[bytes, bytes] = {}

    def set(self, exp_id: bytes, version: bytes, values: bytes) -> None:
        self.rows.set(exp_id, unit(unpack_float16(values)))
        self.raw[exp_id] = values
        self.version[exp_id] = version

    def remove(self, exp_id: bytes) -> None:
        if exp_id in self.raw:
            self.rows.remove(exp_id)
            del self.raw[exp_id], self.version[exp_id]


class _VectorOverlay:
    """One batch's changes to the live vectors, over the committed ones (which stay as they are).

    The adds the fold will meet are scored against the committed rows a chunk at a time, in one
    matrix product; the few rows this batch changed are scored separately.
    """

    def __init__(self, base: LiveVectors) -> None:
        self.base = base
        self._rows = _Rows(base.rows.matrix.shape[1])
        #: experience id -> (version, values) now live, or None: no longer live. In change order.
        self.changes: dict[bytes, tuple[bytes, bytes] | None] = {}
        self._plan: list[tuple[bytes, bytes]] = []
        self._plan_index: dict[bytes, int] = {}
        self._prepared: dict[bytes, int] = {}
        self._scores = np.zeros((0, 0), dtype=np.float32)

    def set(self, exp_id: bytes, version: bytes, values: bytes) -> None:
        if self.version(exp_id) != version:
            self.changes[exp_id] = (version, values)
            self._rows.set(exp_id, unit(unpack_float16(values)))

    def remove(self, exp_id: bytes) -> None:
        if self.version(exp_id) is not None:
            self.changes[exp_id] = None
            self._rows.remove(exp_id)

    def version(self, exp_id: bytes) -> bytes | None:
        if exp_id in self.changes:
            change = self.changes[exp_id]
            return change[0] if change else None
        return self.base.version.get(exp_id)

    def values(self, exp_id: bytes) -> bytes:
        change = self.changes.get(exp_id)
        return change[1] if change else self.base.raw[exp_id]

    def plan(self, upcoming: list[tuple[bytes, bytes]]) -> None:
        """The adds the fold will meet, in order (key, float16 values); they are scored in chunks."""
        self._plan = upcoming
        self._plan_index = {key: index for index, (key, _) in enumerate(upcoming)}
        self._prepared = {}

    def _prepare(self, start: int) -> None:
        chunk = self._plan[start : start + _CHUNK]
        self._prepared = {key: column for column, (key, _) in enumerate(chunk)}
        self._scores = self.base.rows.scores(np.stack([unit(unpack_float16(values)) for _, values in chunk]).T)

    def candidates(self, values: bytes, threshold: float, key: bytes) -> list[bytes]:
        floor = threshold - _PREFILTER_MARGIN
        if key not in self._prepared and key in self._plan_index:
            self._prepare(self._plan_index[key])
        column = self._prepared.get(key)
        query = unit(unpack_float16(values))
        scores = self._scores[:, column] if column is not None else self.base.rows.scores(query)
        committed = [exp_id for exp_id in self.base.rows.above(scores, floor) if exp_id not in self.changes]
        return committed + self._rows.above(self._rows.scores(query), floor)


@dataclass
class Fold:
    """Everything one batch's fold changed outside its transaction, published after the commit."""

    vectors: _VectorOverlay
    operations: dict[bytes, Operation]  # the new operations being folded (not yet in the store)
    refolded: int = 0  # operations folded again because a late one sorted before them
    changed: bool = False  # whether any operation was folded (the library's generation moves on)


class _Step:
    """The writes of one fold step, remembering each key's previous value so the step can be undone.

    Reads are cached for the step, so a key read by the rules costs nothing more when the step
    writes it and must remember its old value.
    """

    def __init__(self, library: Library, txn: Transaction, fold: Fold) -> None:
        self._library = library
        self._txn = txn
        self._fold = fold
        self.undo: list[list[bytes | None]] = []
        self._touched: set[bytes] = set()
        self._raw: dict[bytes, bytes | None] = {}
        self._records: dict[bytes, ExperienceRecord | None] = {}

    def get(self, key: bytes) -> bytes | None:
        if key not in self._raw:
            self._raw[key] = self._txn.get(key)
        return self._raw[key]

    def scan(self, prefix: bytes, start: bytes | None = None) -> Iterator[tuple[bytes, bytes]]:
        return self._txn.scan(prefix, start)

    def record(self, exp_id: bytes) -> ExperienceRecord | None:
        """The experience record as this step last wrote it; a copy the caller may change and put back."""
        if exp_id not in self._records:
            raw = self.get(experience_key(exp_id))
            self._records[exp_id] = ExperienceRecord.unpack(raw) if raw is not None else None
        found = self._records[exp_id]
        return found.copy() if found is not None else None

    def put_record(self, record: ExperienceRecord) -> ExperienceRecord | None:
        """Write `record`; returns the previous version (to maintain the domain index)."""
        exp_id = record.id.raw
        self.record(exp_id)
        old = self._records[exp_id]
        self._records[exp_id] = record
        self.put(experience_key(exp_id), record.pack(), record)
        return old

    def put(self, key: bytes, value: bytes | None, record: ExperienceRecord | None = None) -> None:
        if key not in self._touched:
            self._touched.add(key)
            self.undo.append([key, self.get(key)])
        self._raw[key] = value
        self._library.write_state(self._txn, self._fold, key, value, record)


def _sorted_cids(raws: Iterable[bytes]) -> list[CID]:
    return [CID(raw) for raw in sorted(set(raws))]


class Library:
    """Reads and folds the library's tables. Holds no view: every read names the one it reads."""

    def __init__(self, params: NetworkParams) -> None:
        self._params = params
        self._threshold = Fraction(params.near_duplicate_cosine)
        # Invariant: entries are immutable facts about content-addressed operations: any thread may fill it.
        self._meta: dict[bytes, OpMeta] = {}
        # Invariant: equals the live experiences of the last published commit (None: not loaded yet).
        # Only the writer touches it, in `fold` (to read) and `publish` (to change).
        self._vectors: LiveVectors | None = None

    # --- reading -----------------------------------------------------------------------------

    def meta(self, view: ReadView, cid_raw: bytes) -> OpMeta:
        found = self._meta.get(cid_raw)
        if found is None:
            raw = view.get(opmeta_key(cid_raw))
            if raw is None:
                raise KeyError(f"no operation {CID(cid_raw)}")
            found = OpMeta.decode(raw)
            if len(self._meta) >= _META_CACHE_LIMIT:
                self._meta.clear()
            self._meta[cid_raw] = found
        return found

    @staticmethod
    def record(view: ReadView, exp_id: bytes) -> ExperienceRecord | None:
        raw = view.get(experience_key(exp_id))
        return ExperienceRecord.unpack(raw) if raw is not None else None

    @staticmethod
    def status(view: ReadView, cid_raw: bytes) -> OpStatus | None:
        """The stored verdict of a folded operation (superseded modifies still read 'applied' here)."""
        raw = view.get(status_key(cid_raw))
        return OpStatus.unpack(raw) if raw is not None else None

    @staticmethod
    def content(view: ReadView, op_cid: bytes, folding: dict[bytes, Operation] | None = None) -> Experience:
        """The experience an add, modify or merge carries (operations being folded come from memory)."""
        op = (folding or {}).get(op_cid) or load_stored(view.get(block_key(op_cid)))
        assert op.content is not None
        return op.content

    def resolve(self, view: ReadView | _Step, exp_id: bytes) -> bytes:
        """Follow aliases (merged or absorbed experiences) to the experience that stands for them."""
        read = view.record if isinstance(view, _Step) else lambda key: self.record(view, key)
        record = read(exp_id)
        while record is not None and record.status is Life.ALIAS:
            assert record.alias_of is not None
            exp_id = record.alias_of.raw
            record = read(exp_id)
        return exp_id

    @staticmethod
    def experiences(view: ReadView, start: bytes | None = None) -> Iterator[ExperienceRecord]:
        """Every experience record in id order (from id `start` on)."""
        for _, raw in view.scan(EXPERIENCE, experience_key(start) if start else None):
            yield ExperienceRecord.unpack(raw)

    @staticmethod
    def in_domain(view: ReadView, domain: str, *, subdomains: bool) -> Iterator[bytes]:
        """Ids of live experiences in exactly `domain` or (subdomains) under it."""
        for key, _ in view.scan(by_domain_prefix(domain, subdomains=subdomains)):
            yield parse_by_domain_key(key)

    @staticmethod
    def naming(view: ReadView, target: bytes) -> Iterator[bytes]:
        """Applied operations naming `target`, in fold order."""
        for key, _ in view.scan(by_target_prefix(target)):
            yield order_cid(parse_by_target_key(key))

    @staticmethod
    def applied_in_order(view: ReadView) -> Iterator[bytes]:
        for key, _ in view.scan(ORDER):
            yield order_cid(parse_ordered_key(key))

    @staticmethod
    def votes(view: ReadView, exp_id: bytes) -> dict[str, Vote]:
        """Each author's counted vote on an experience."""
        return {parse_votes_key(key)[1]: Vote.unpack(raw) for key, raw in view.scan(votes_prefix(exp_id))}

    def snapshot(self, view: ReadView) -> bytes:
        """Every experience record, operation status and counted vote: equal bytes, equal library."""
        return codec.encode(
            {
                "experiences": [raw for _, raw in view.scan(EXPERIENCE)],
                "statuses": [[CID(cid_of_key(key)), raw] for key, raw in view.scan(STATUS)],
                "votes": [[key, raw] for key, raw in view.scan(VOTES)],
            }
        )

    def is_ancestor(self, view: ReadView, ancestor: bytes, descendant: bytes) -> bool:
        """Whether `ancestor` is reachable from `descendant` through parent links."""
        return ancestor in self.ancestors_among(view, [ancestor], descendant)

    def ancestors_among(self, view: ReadView, candidates: list[bytes], descendant: bytes) -> set[bytes]:
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

    def clock_void(self, view: ReadView, meta: OpMeta) -> OpStatus | None:
        """The void status of an operation whose clock does not exceed its parents' or targets' (§7.4)."""
        if any(self.meta(view, parent).clock >= meta.clock for parent in meta.parents):
            return OpStatus.void("clock.parent", "its clock does not exceed every parent's")
        if any(self.meta(view, target).clock >= meta.clock for target in meta.targets):
            return OpStatus.void("clock.target", "its clock does not exceed its target's")
        return None

    # --- writing (the writer only) -------------------------------------------------------------

    def _load_vectors(self, view: ReadView) -> LiveVectors:
        """The committed live vectors (built once, lazily: the first fold after start-up pays it)."""
        vectors = LiveVectors(self._params.embedding_dim)
        for record in self.experiences(view):
            if record.live:
                version = record.version.raw
                vectors.set(record.id.raw, version, self.content(view, version).embedding.values)
        return vectors

    def clear(self, txn: Transaction, view: ReadView) -> None:
        """Delete every table the fold writes (a rebuild folds everything again from nothing)."""
        for table in TABLES:
            for key, _ in view.scan(table):
                txn.delete(key)

    def write_state(
        self, txn: Transaction, fold: Fold, key: bytes, value: bytes | None, record: ExperienceRecord | None = None
    ) -> None:
        """Every write to fold state goes here, so the batch's vectors follow the experience records."""
        txn.put(key, value)
        if not is_experience_key(key):
            return
        exp_id = cid_of_key(key)
        if record is None and value is not None:
            record = ExperienceRecord.unpack(value)
        if record is not None and record.live:
            version = record.version.raw
            if fold.vectors.version(exp_id) != version:
                fold.vectors.set(exp_id, version, self.content(txn, version, fold.operations).embedding.values)
        else:
            fold.vectors.remove(exp_id)

    def publish(self, fold: Fold) -> None:
        """Make a committed batch's vector changes the committed state."""
        base = fold.vectors.base
        for exp_id, change in fold.vectors.changes.items():
            if change is None:
                base.remove(exp_id)
            else:
                base.set(exp_id, *change)
        self._vectors = base

    def fold(
        self,
        txn: Transaction,
        committed: ReadView,
        ready: list[tuple[bytes, Operation]],
        progress: Callable[[int, int], None] | None = None,
        *,
        from_empty: bool = False,
    ) -> Fold:
        """Fold newly applied operations; refold the tail when one sorts before already-folded ones.

        Reads through `txn` and writes into it, and changes nothing else: the returned Fold is what
        `publish` applies once the transaction has committed. `committed` is the state the
        transaction started from (to load the live vectors the first time); `from_empty` folds
        onto an empty library (a rebuild). `progress(done, total)` is called every 10,000 folded
        operations (long rebuilds).
        """
        if from_empty:
            base = LiveVectors(self._params.embedding_dim)
        else:
            if self._vectors is None:
                self._vectors = self._load_vectors(committed)
            base = self._vectors
        fold = Fold(_VectorOverlay(base), dict(ready), changed=bool(ready))
        new_keys: dict[bytes, Operation] = {}
        start = None
        for cid_raw, op in ready:
            order = order_key(op.clock, cid_raw)
            meta = self.meta(txn, cid_raw)
            for target in meta.targets:
                txn.put(by_target_key(target, order), bytes([_KINDS.index(op.kind)]))
            void = self.clock_void(txn, meta)
            if void is not None:
                # void wherever it sorts and read by no rule: record it in place, refold nothing
                txn.put(ordered_key(order), b"")
                txn.put(undo_key(cid_raw), codec.pack([[status_key(cid_raw), txn.get(status_key(cid_raw))]]))
                txn.put(status_key(cid_raw), void.pack())
                continue
            new_keys[order] = op
            start = order if start is None or order < start else start
        if start is None:
            return fold
        for order, op in new_keys.items():
            if op.kind in (Kind.DELETE, Kind.MODIFY):
                assert op.target is not None
                for merge in self._merges_naming(txn, op.target.raw):
                    # a merge folded earlier must be folded again unless this operation saw it
                    if merge < start and not self.is_ancestor(txn, order_cid(merge), order_cid(order)):
                        start = merge
        tail = [parse_ordered_key(key) for key, _ in txn.scan(ORDER, ordered_key(start))]
        fold.refolded = len(tail)
        for order in reversed(tail):
            self._undo(txn, fold, order_cid(order))
        for order in new_keys:
            txn.put(ordered_key(order), b"")
        fold.vectors.plan(
            [
                (order_cid(order), op.content.embedding.values)
                for order, op in sorted(new_keys.items())
                if op.kind is Kind.ADD and op.content
            ]
        )
        sequence = sorted([*tail, *new_keys])
        for done, order in enumerate(sequence, 1):
            self._fold_one(txn, fold, order_cid(order), new_keys.get(order))
            if progress and done % 10_000 == 0:
                progress(done, len(sequence))
        return fold

    def _merges_naming(self, view: ReadView, target: bytes) -> Iterator[bytes]:
        merge = bytes([_KINDS.index(Kind.MERGE)])
        for key, kind in view.scan(by_target_prefix(target)):
            if kind == merge:
                yield parse_by_target_key(key)

    def _undo(self, txn: Transaction, fold: Fold, cid_raw: bytes) -> None:
        undo = codec.unpack(txn.get(undo_key(cid_raw)))
        for key, old in reversed(undo):
            self.write_state(txn, fold, key, old)
        txn.delete(undo_key(cid_raw))

    def _fold_one(self, txn: Transaction, fold: Fold, cid_raw: bytes, op: Operation | None) -> None:
        if op is None:
            op = load_stored(txn.get(block_key(cid_raw)))
        step = _Step(self, txn, fold)
        status = self._rule(step, fold, cid_raw, op)
        step.put(status_key(cid_raw), status.pack())
        txn.put(undo_key(cid_raw), codec.pack(step.undo))

    # --- the rules (docs/PROTOCOL.md §7) -------------------------------------------------------

    def _rule(self, step: _Step, fold: Fold, cid: bytes, op: Operation) -> OpStatus:
        meta = self.meta(step, cid)
        void = self.clock_void(step, meta)
        if void is not None:
            return void
        for target in meta.targets:
            if step.get(experience_key(target)) is None:
                return OpStatus.void("target.not_experience", f"target {CID(target)} did not create an experience")
        if op.kind is Kind.ADD:
            return self._add(step, fold, cid, op)
        if op.kind is Kind.MERGE:
            return self._merge(step, cid, op, meta)
        exp_id = self.resolve(step, meta.targets[0])
        record = step.record(exp_id)
        assert record is not None
        if op.kind is Kind.MODIFY:
            return self._modify(step, fold, cid, record)
        if op.kind is Kind.DELETE:
            record.status = Life.DELETED
            record.deleted_by = _sorted_cids([*(c.raw for c in record.deleted_by), cid])
            self._put_experience(step, record)
            return OpStatus.applied(exp_id)
        assert op.vote is not None
        self._vote(step, record, op.author, Vote(op.clock, CID(cid), op.vote))
        self._put_experience(step, record)
        return OpStatus.applied(exp_id)

    @staticmethod
    def _vote(step: _Step, record: ExperienceRecord, author: str, vote: Vote) -> None:
        """Count `vote` for `record` if it is the author's latest (by clock, then CID)."""
        key = votes_key(record.id.raw, author)
        raw = step.get(key)
        current = Vote.unpack(raw) if raw is not None else None
        if current is not None and not vote.later_than(current):
            return
        if current is not None:
            if current.value > 0:
                record.up -= 1
            else:
                record.down -= 1
        if vote.value > 0:
            record.up += 1
        else:
            record.down += 1
        step.put(key, vote.pack())

    def _add(self, step: _Step, fold: Fold, cid: bytes, op: Operation) -> OpStatus:
        assert op.content is not None
        record = _new_record(cid, op, support=1)
        similar = self._earliest_similar(step, fold, cid, op.content.embedding.values)
        if similar is None:
            self._put_experience(step, record)
            return OpStatus.applied(cid)
        into = step.record(similar)
        assert into is not None
        into.support += 1
        into.absorbed = _sorted_cids([*(c.raw for c in into.absorbed), cid])
        record.status, record.alias_of = Life.ALIAS, CID(similar)
        self._put_experience(step, into)
        self._put_experience(step, record)
        return OpStatus(Outcome.ABSORBED, into=CID(similar))

    def _earliest_similar(self, step: _Step, fold: Fold, cid: bytes, values: bytes) -> bytes | None:
        """The canonically earliest live experience with exact cosine above the near-duplicate threshold."""
        best: tuple[int, bytes] | None = None
        for exp_id in fold.vectors.candidates(values, float(self._threshold), cid):
            if exact_cosine_exceeds(values, fold.vectors.values(exp_id), self._threshold):
                record = step.record(exp_id)
                assert record is not None
                rank = (record.clock, exp_id)
                best = rank if best is None or rank < best else best
        return best[1] if best else None

    def _modify(self, step: _Step, fold: Fold, cid: bytes, record: ExperienceRecord) -> OpStatus:
        if record.status is Life.DELETED:
            return OpStatus.void("superseded.deleted", "its experience was deleted (delete beats modify)")
        old_heads = [head.raw for head in record.heads]
        seen = self.ancestors_among(step, old_heads, cid) if old_heads else set()
        heads = [head for head in old_heads if head not in seen] + [cid]
        winner = min(heads, key=lambda head: (-self.meta(step, head).clock, head))
        record.heads = _sorted_cids(heads)
        record.version = CID(winner)
        record.domain = ".".join(self.content(step, winner, fold.operations).domain)
        self._put_experience(step, record)
        return OpStatus.applied(record.id.raw)

    def _merge(self, step: _Step, cid: bytes, op: Operation, meta: OpMeta) -> OpStatus:
        delete, modify = bytes([_KINDS.index(Kind.DELETE)]), bytes([_KINDS.index(Kind.MODIFY)])
        for target in meta.targets:
            for key, kind in step.scan(by_target_prefix(target)):
                other = order_cid(parse_by_target_key(key))
                if self.clock_void(step, self.meta(step, other)) is not None:
                    continue  # void by its clock: it acts on nothing, not even a merge
                if kind == delete and not self.is_ancestor(step, cid, other):
                    return OpStatus.void(
                        "merge.concurrent_delete", f"{CID(other)} deletes a source (delete beats merge)"
                    )
                if kind == modify and not self.is_ancestor(step, other, cid) and not self.is_ancestor(step, cid, other):
                    return OpStatus.void(
                        "merge.concurrent_modify", f"{CID(other)} modifies a source (modify beats merge)"
                    )
        roots = sorted({self.resolve(step, target) for target in meta.targets})
        sources = [step.record(root) for root in roots]
        if any(source is None or source.status is Life.DELETED for source in sources):
            return OpStatus.void("merge.target_deleted", "a source was deleted before the merge")
        record = _new_record(cid, op, support=sum(source.support for source in sources if source))
        record.absorbed = _sorted_cids(roots)
        for root in roots:  # every author's latest vote on any source counts for the merged experience
            for key, raw in step.scan(votes_prefix(root)):
                self._vote(step, record, parse_votes_key(key)[1], Vote.unpack(raw))
        for source in sources:
            assert source is not None
            source.status, source.alias_of = Life.ALIAS, CID(cid)
            self._put_experience(step, source)
        self._put_experience(step, record)
        return OpStatus.applied(cid)

    @staticmethod
    def _put_experience(step: _Step, record: ExperienceRecord) -> None:
        exp_id = record.id.raw
        old = step.put_record(record)
        was = by_domain_key(old.domain, exp_id) if old and old.live else None
        now = by_domain_key(record.domain, exp_id) if record.live else None
        if was != now:
            if was is not None:
                step.put(was, None)
            if now is not None:
                step.put(now, b"")


def _new_record(cid: bytes, op: Operation, support: int) -> ExperienceRecord:
    assert op.content is not None
    return ExperienceRecord(
        id=CID(cid),
        created_by=op.author,
        clock=op.clock,
        status=Life.LIVE,
        alias_of=None,
        version=CID(cid),
        heads=[],
        domain=".".join(op.content.domain),
        support=support,
    )
