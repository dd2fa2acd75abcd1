"""The ingest pipeline every source shares (local tools, RPC clients, gossip, sync), and the batch it writes.

Checks run cheapest first, so a duplicate never costs a decode or a signature check (as
go-libp2p-pubsub consults its seen-cache before validating):

0. the item is bytes, within the size limit                     -> rejected (`ingest.type`, `limits.op_bytes`)
1. the CID of the bytes, against the CID claimed for them       -> rejected (`cid.mismatch`)
2. repeated in this batch, or already stored                    -> ignored (nothing written)
3. codec, schema, text rules, signature (`validation.examine`)  -> rejected
4. embedding consistency, one batched embedding of the texts    -> rejected (`embedding.inconsistent`)
5. store, log, wait for dependencies, fold: one `Batch`, one synced LevelDB write

Step 3 hands the signatures of a batch to two threads (libsodium releases the GIL), which check
them while the writer decodes the rest and runs step 4; a bad signature is the verdict reported
even when step 4 also failed, and nothing is stored before every signature is settled.
Steps 0-3 need no node state beyond "is it stored": a gossip validator runs `validation.examine`
alone. A rejection is the sender's fault (a peer scorer penalises it); an ignored item is nobody's.

A `Batch` is built on the committed state the writer holds, writes every change into one
transaction, and changes nothing else: the log cursor, the state root and the library's
in-memory vectors it computes are published by the ledger only after the write succeeded, so a
failed write needs no undoing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum

from ledger.cid import CID
from ledger.errors import LedgerError
from ledger.library import Fold, Library, OpMeta
from ledger.merkle import LogAppender
from ledger.ops import Block, Kind, Operation, load_stored
from ledger.params import NetworkParams
from ledger.priority import NEVER
from ledger.records import OpStatus
from ledger.stateroot import StateRoot
from ledger.store import ReadView, Store, Transaction
from ledger.tables import (
    GENERATION,
    PENDING,
    STATE_ROOT,
    WAITER,
    block_key,
    by_author_key,
    head_key,
    join_cids,
    opmeta_key,
    parse_waiter_key,
    pending_key,
    read_u64,
    split_cids,
    u64,
    waiter_key,
    waiter_prefix,
)
from ledger.validation import SignatureChecks, ValidationError, examine


class IngestError(LedgerError):
    """Arguments to `Ledger.ingest` that are not a batch of operations (a programming error of the caller)."""


class Verdict(StrEnum):
    """What ingest decided about one submission, and so who is at fault when it fails."""

    ACCEPTED = "accepted"  # stored by this batch
    IGNORED = "ignored"  # already stored, or repeated in the batch: nothing written, nobody at fault
    REJECTED = "rejected"  # invalid: nothing written; the sender is at fault


@dataclass(frozen=True, slots=True)
class Source:
    """Where a submission came from: `kind` is "local", "rpc", "curator", "gossip" or "sync"; `name` a client or peer
    id."""

    kind: str
    name: str = ""

    @property
    def from_peer(self) -> bool:
        """Received from the network, rather than made on this node (which gossips only what it made)."""
        return self.kind in ("gossip", "sync")


LOCAL = Source("local")


@dataclass(frozen=True, slots=True)
class Submission:
    data: bytes
    source: Source = LOCAL
    claimed: CID | None = None  # the CID the sender says the bytes have
    #: `data` as `decode_block` made it in this process (p2p decodes what it receives to see its dependencies):
    #: triage checks it without decoding the bytes again (9 us instead of 83 per operation of the bench workload)
    decoded: Block | None = None

    @classmethod
    def of(cls, item: bytes | Block, source: Source) -> Submission:
        """A submission of operation bytes, or of a Block decoded from them."""
        return cls(item.data, source, decoded=item) if isinstance(item, Block) else cls(item, source)


@dataclass(frozen=True, slots=True)
class Receipt:
    """The answer to one submission: the verdict, and for a stored operation the fold's status after the batch."""

    cid: CID | None
    verdict: Verdict
    status: OpStatus | None = None
    errors: tuple[LedgerError, ...] = ()
    source: Source = LOCAL
    repeated: bool = False  # ignored because it came earlier in the same batch (not already stored)
    kind: Kind | None = None  # the operation's kind, when its bytes decoded

    @property
    def outcome(self) -> str:
        """One word for people, logs and metrics: the fold's outcome, "duplicate" or "invalid"."""
        if self.verdict is Verdict.REJECTED:
            return "invalid"
        if self.verdict is Verdict.IGNORED:
            return "duplicate"
        assert self.status is not None
        return self.status.outcome.value

    @property
    def code(self) -> str | None:
        """Why: the first broken rule of a rejection, or the rule behind a void or superseded status."""
        if self.errors:
            return self.errors[0].code
        return self.status.code if self.status else None


def as_submissions(items: object, expected: object = None) -> list[Submission]:
    """Submissions from `items` (bytes or Submission) and the optional claimed CIDs, checking their shapes."""
    if isinstance(items, (bytes, bytearray, memoryview, str)) or not isinstance(items, Sequence):
        raise IngestError("ingest.argument", f"items: expected a sequence of operations, got {type(items).__name__}")
    claims: Sequence[object] = [None] * len(items)
    if expected is not None:
        if not isinstance(expected, Sequence) or isinstance(expected, (bytes, str)) or len(expected) != len(items):
            raise IngestError("ingest.argument", f"expected: must be None or one CID (or None) per item ({len(items)})")
        claims = expected
    submissions = []
    for index, (item, claim) in enumerate(zip(items, claims, strict=True)):
        if claim is not None and not isinstance(claim, CID):
            raise IngestError(
                "ingest.argument", f"expected[{index}]: expected a CID or None, got {type(claim).__name__}"
            )
        submissions.append(item if isinstance(item, Submission) else Submission(item, LOCAL, claim))
    return submissions


@dataclass
class Checked:
    """One submission on its way through the pipeline."""

    submission: Submission
    cid: CID | None = None
    block: Block | None = None
    errors: tuple[LedgerError, ...] = ()
    ignored: bool = False
    first: int | None = None  # the earlier position of the same bytes in this batch
    kind: Kind | None = None  # once the bytes decoded


def triage(
    submissions: Sequence[Submission],
    params: NetworkParams,
    stored: ReadView,
    signatures: SignatureChecks,
    pause: Callable[[], None] = NEVER.pause,
) -> list[Checked]:
    """Steps 0-3: every submission checked as far as it goes; valid new ones carry their Block, and their
    signature is being checked in `signatures` (see `settle_signatures`).

    `pause()` is called between submissions (reads go first)."""
    checked: list[Checked] = []
    positions: dict[bytes, int] = {}
    for index, submission in enumerate(submissions):
        pause()
        item = Checked(submission)
        checked.append(item)
        data: object = submission.data
        if isinstance(data, (bytearray, memoryview)):
            data = bytes(data)
        if type(data) is not bytes:
            item.errors = (IngestError("ingest.type", f"items[{index}]: expected bytes, got {type(data).__name__}"),)
            continue
        if len(data) > params.max_op_bytes:
            item.errors = (
                ValidationError(
                    "limits.op_bytes", f"operation: {len(data)} bytes, the network allows {params.max_op_bytes}"
                ),
            )
            continue
        item.cid = CID.for_block(data)
        claimed = submission.claimed
        if claimed is not None and claimed != item.cid:
            item.errors = (
                ValidationError("cid.mismatch", f"cid: content hashes to {item.cid}, not the claimed {claimed}"),
            )
            continue
        if item.cid.raw in positions:
            item.first = positions[item.cid.raw]
            continue
        positions[item.cid.raw] = index
        if stored.get(block_key(item.cid.raw)) is not None:
            item.ignored = True
            continue
        block, errors = examine(data, params, signature=False, decoded=submission.decoded)
        item.kind = block.op.kind if block else None
        item.block, item.errors = (block, ()) if not errors else (None, tuple(errors))
        if item.block is not None:
            signatures.add(item.block)
    return checked


def settle_signatures(checked: list[Checked], signatures: SignatureChecks) -> None:
    """Wait for the signature verdicts of `triage`: an item whose signature fails is rejected for that alone."""
    failed = {cid: error for cid, error in signatures.verdicts().items() if error is not None}
    for item in checked:
        if item.cid is not None and item.first is None and item.cid.raw in failed:
            item.block, item.errors = None, (failed[item.cid.raw],)


@dataclass(frozen=True, slots=True)
class WriterState:
    """What the single writer carries from one batch to the next; replaced (never changed) after a commit.

    Invariant: equals what the last committed batch wrote (log size, state-root lanes, generation, the pending
    operations and the dependencies they wait for, as the P and W tables hold them).
    """

    log_size: int
    state_root: bytes
    generation: int
    pending: int  # operations stored but waiting for dependencies
    #: the dependencies some pending operation waits for (the first CIDs of the W keys): an applied operation
    #: outside it has no waiter to look for, so one operation left pending does not cost every later one a scan
    awaited: frozenset[bytes] = frozenset()

    @classmethod
    def read(cls, view: ReadView, log_size: int) -> WriterState:
        pending = sum(1 for _ in view.scan(PENDING))
        awaited = frozenset(parse_waiter_key(key)[0] for key, _ in view.scan(WAITER))
        root, generation = view.get(STATE_ROOT) or StateRoot().to_bytes(), read_u64(view.get(GENERATION))
        return cls(log_size, root, generation, pending, awaited)


def parents_first(blocks: list[Block]) -> list[Block]:
    """`blocks` in their order, except that each comes after its dependencies among them.

    The ledger stores an operation whose dependency is not applied yet as pending, with its waiters, and so every
    operation that descends from it in the batch, until the end of the batch releases them all: sync fetches in
    clock order, and an operation whose clock does not exceed its parent's (void, but valid) sorted ahead of its
    parent left most of a batch pending. O(operations + dependencies); CIDs are hashes, so there is no cycle."""
    index = {block.cid.raw: number for number, block in enumerate(blocks)}
    if all(index.get(dep.raw, -1) < number for number, block in enumerate(blocks) for dep in block.op.dependencies):
        return blocks
    ordered: list[Block] = []
    placed = [False] * len(blocks)
    for start in range(len(blocks)):
        stack = [start]  # a depth-first walk to the dependencies not placed yet: no recursion for a long chain
        while stack:
            number = stack[-1]
            if placed[number]:
                stack.pop()
                continue
            before = (index.get(dep.raw) for dep in blocks[number].op.dependencies)
            unplaced = [dep for dep in before if dep is not None and not placed[dep]]
            if unplaced:
                stack.extend(reversed(unplaced))
                continue
            placed[number] = True
            ordered.append(blocks[number])
            stack.pop()
    return ordered


class Batch:
    """The writes of one ingest, built on a committed state; `commit` makes them durable in one write."""

    def __init__(
        self, store: Store, library: Library, base: WriterState, pause: Callable[[], None] = NEVER.pause
    ) -> None:
        """`pause()` is called between operations (reads go first)."""
        self.base = base
        self._pause = pause
        self.txn: Transaction = store.transaction()
        self._library = library
        self._log = LogAppender(self.txn, base.log_size)
        self._root = StateRoot(base.state_root)
        self.applied: list[bytes] = []
        self.fold: Fold | None = None
        self._pending = base.pending
        self._awaited = set(base.awaited)  # the committed state's, changed by this batch
        self.waited = 0  # operations this batch stored pending (applied later in it or by a later batch)

    def store(self, blocks: list[Block]) -> None:
        """Store, log and index `blocks` (each after its dependencies among them), apply what has every dependency,
        and fold it."""
        txn, ready = self.txn, []
        for block in parents_first(blocks):
            self._pause()
            cid, meta = block.cid.raw, OpMeta.of(block.op)
            txn.put_block(cid, block.data)
            txn.put(opmeta_key(cid), meta.encode())
            position = self._log.append(cid)
            txn.put(by_author_key(block.op.author, position), cid)
            self._root.add(cid)
            waiting = [dep for dep in meta.dependencies if not self._applied(dep)]
            if waiting:
                self._pending += 1
                self.waited += 1
                txn.put(pending_key(cid), join_cids(waiting))
                for dep in waiting:
                    txn.put(waiter_key(dep, cid), b"")
                self._awaited.update(waiting)
            else:
                ready.append(cid)
        self.applied = self._release(ready)
        self._move_heads(self.applied)
        txn.put(STATE_ROOT, self._root.to_bytes())
        new_ops = {block.cid.raw: block.op for block in blocks}
        ops = [new_ops[cid] if cid in new_ops else load_stored(txn.block(cid)) for cid in self.applied]
        self.fold = self._library.fold(txn, list(zip(self.applied, ops, strict=True)), pause=self._pause)

    def refold(self, applied: list[tuple[bytes, Operation]]) -> None:
        """Fold applied operations again, which sort after every one folded since the library was cleared (a
        rebuild's next chunk)."""
        self.fold = self._library.fold(self.txn, applied)

    def commit(self) -> WriterState:
        """Write everything in one synced LevelDB write; returns the state the writer carries on with."""
        generation = self.base.generation + (1 if self.fold is not None and self.fold.changed else 0)
        self.txn.put(GENERATION, u64(generation))
        self.txn.commit(self._pause)
        return WriterState(self._log.size, self._root.to_bytes(), generation, self._pending, frozenset(self._awaited))

    def _applied(self, cid: bytes) -> bool:
        stored = self.txn.get(opmeta_key(cid)) is not None
        return stored and (self._pending == 0 or self.txn.get(pending_key(cid)) is None)

    def _release(self, ready: list[bytes]) -> list[bytes]:
        """Mark `ready` applied and wake, transitively, every pending operation that waited only on them."""
        applied, queue, txn = [], list(ready), self.txn
        while queue:
            cid = queue.pop()
            applied.append(cid)
            if cid not in self._awaited:  # nobody waits for it: no scan (a LevelDB iterator each)
                continue
            self._awaited.discard(cid)
            for key, _ in list(txn.scan(waiter_prefix(cid))):
                waiter = parse_waiter_key(key)[1]
                txn.delete(key)
                still = [dep for dep in split_cids(txn.get(pending_key(waiter)) or b"") if dep != cid]
                if still:
                    txn.put(pending_key(waiter), join_cids(still))
                else:
                    txn.delete(pending_key(waiter))
                    self._pending -= 1
                    queue.append(waiter)
        return applied

    def _move_heads(self, applied: list[bytes]) -> None:
        """Heads are applied operations no applied operation names as parent; a child applies after its parents."""
        meta = self._library.meta
        named = {parent for cid in applied for parent in meta(self.txn, cid).parents}
        for parent in named:
            self._pause()
            self.txn.delete(head_key(meta(self.txn, parent).clock, parent))
        for cid in applied:
            if cid not in named:
                self.txn.put(head_key(meta(self.txn, cid).clock, cid), b"")
