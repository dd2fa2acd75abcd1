"""A node's ledger: validate, store, log, wait for dependencies, fold — one atomic batch at a time."""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ledger import codec
from ledger.cid import CID, CID_LENGTH
from ledger.embedder import Embedder, embedder_for
from ledger.errors import LedgerError
from ledger.index import ExperienceIndex
from ledger.keys import AuthorKey
from ledger.library import Library, OpMeta
from ledger.merkle import MerkleLog, ProofError, TreeHead
from ledger.ops import Block, Kind, load_stored
from ledger.params import NetworkParams
from ledger.stateroot import StateRoot
from ledger.store import (
    BLOCK,
    BY_AUTHOR,
    BY_DOMAIN,
    BY_TARGET,
    EXPERIENCE,
    LOG,
    META,
    OPMETA,
    ORDER,
    PENDING,
    SEQ,
    STATUS,
    UNDO,
    VOTES,
    WAITER,
    Store,
    StoreError,
    Transaction,
    u64,
)
from ledger.validation import check_embeddings, examine

log = logging.getLogger(__name__)

DB_DIR = "ledger.db"
NODE_KEY = "node.key"
_STATE_ROOT = META + b"state_root"
_GENERATION = META + b"library_generation"  # bumped by every committed change to the library
_NETWORK = META + b"network"  # the network parameters the directory was created with
_INDEX_BACKLOG = 50_000  # changed experiences the index may lag behind before ingest catches it up
#: start-up re-checks this many newest log entries (block present, hash right), like Bitcoin Core's -checkblocks
_RECENT_CHECK = 32


@dataclass(frozen=True, slots=True)
class Outcome:
    """What happened to one submitted operation."""

    cid: CID | None
    status: str  # "applied", "pending", "duplicate" or "invalid"
    errors: tuple[LedgerError, ...] = ()


class Ledger:
    """The storage side of a node. Synchronous: the daemon runs it off the event loop."""

    def __init__(
        self, data_dir: Path, params: NetworkParams, store: Store, node_key: AuthorKey, embedder: Embedder
    ) -> None:
        self.data_dir = data_dir
        self.params = params
        self.store = store
        self.node_key = node_key
        self.embedder = embedder
        self.merkle = MerkleLog(store)
        self.library = Library(store, params)
        self._state_root = StateRoot(store.get(_STATE_ROOT))
        self._check_recent(_RECENT_CHECK)
        self._index = ExperienceIndex(data_dir, params.embedding_model, params.embedding_dim, node_key.did)
        self._index_pending: set[bytes] = set()  # experiences changed since the index last caught up
        why = self._index.load(self.generation)
        #: "loaded", or why the saved index could not be used and was rebuilt
        self.index_status = why or "loaded"
        if why is not None:
            self.rebuild_index(why)

    @classmethod
    def open(cls, data_dir: Path, params: NetworkParams | None = None, embedder: Embedder | None = None) -> Ledger:
        """Open a data directory, creating it when it does not exist or is empty.

        An existing directory whose database is missing, corrupt or foreign is an error: a node
        must never come up with a silently empty ledger.
        """
        data_dir = Path(data_dir)
        params = params or NetworkParams()
        embedder = embedder or embedder_for(params)  # refuses, before touching the data, a model it cannot load
        # a directory holding only the node key is one whose creation was interrupted: finish it
        fresh = not data_dir.exists() or set(os.listdir(data_dir)) <= {NODE_KEY}
        if fresh:
            data_dir.mkdir(parents=True, exist_ok=True)
            os.chmod(data_dir, 0o700)
            if not (data_dir / NODE_KEY).exists():
                AuthorKey.generate().save(data_dir / NODE_KEY)
            store = Store(data_dir / DB_DIR, create=True)
        else:
            store = Store(data_dir / DB_DIR, create=False)
        try:
            node_key = AuthorKey.load(data_dir / NODE_KEY)
        except LedgerError as exc:
            store.close()
            raise StoreError(exc.code, f"node key: {exc.message}") from None
        try:
            _check_network(store, params)
            return cls(data_dir, params, store, node_key, embedder)
        except BaseException:
            store.close()
            raise

    def close(self) -> None:
        try:
            self.index.save()  # if this fails the next start rebuilds the index; the ledger itself is safe
        finally:
            self.store.close()

    @property
    def generation(self) -> int:
        raw = self.store.get(_GENERATION)
        return int.from_bytes(raw, "big") if raw else 0

    def _check_recent(self, count: int) -> None:
        for position in range(max(0, self.log_size - count), self.log_size):
            self._check_entry(position)

    def _check_entry(self, position: int) -> None:
        cid = self.logged(position)
        data = self.store.get(BLOCK + cid.raw)
        if data is None or CID.for_block(data) != cid or self.store.get(OPMETA + cid.raw) is None:
            raise StoreError("store.corrupt", f"log entry {position} ({cid}): its block is missing or damaged")
        if self.merkle.leaf_hash(position) != self.merkle.hash_buff(cid.raw):
            raise StoreError("store.corrupt", f"log entry {position} ({cid}): its Merkle leaf is damaged")

    def verify(self, progress: Callable[[int, int], None] | None = None) -> None:
        """Check everything: every table's checksums, every logged block against its CID, the Merkle root.

        Reads every key (so LevelDB verifies every block's checksum), re-hashes every logged block
        and leaf, and recomputes the root from the leaves.

        Takes time linear in the log (like `ipfs repo verify`); raises StoreError at the first damage.
        """
        for _ in self.store.scan(b""):  # every table
            pass
        for position in range(self.log_size):
            self._check_entry(position)
            if progress and (position + 1) % 10_000 == 0:
                progress(position + 1, self.log_size)
        if self.merkle.root() != self.merkle._get_root_naive(0, self.log_size):
            raise StoreError("store.corrupt", "the stored Merkle subtree hashes disagree with the leaves")

    # --- ingest ------------------------------------------------------------------------------

    def submit(self, data: bytes, expected_cid: CID | None = None) -> Outcome:
        return self.ingest([data], [expected_cid])[0]

    def ingest(self, items: Sequence[bytes], expected: Sequence[CID | None] | None = None) -> list[Outcome]:
        """Validate, store, log and fold a batch in one durable write; returns after the data is synced."""
        outcomes: list[Outcome] = []
        accepted: list[Block] = []
        seen: set[bytes] = set()
        checked = [examine(data, self.params, expected[i] if expected else None) for i, data in enumerate(items)]
        valid = {block.cid.raw: block for block, errors in checked if block and not errors}
        stored = {raw for raw, block in valid.items() if self.has(block.cid)}
        # each new operation's embedding is checked once; stored ones were checked when first accepted
        new = [block for raw, block in valid.items() if raw not in stored]
        inconsistent = check_embeddings(new, self.embedder, self.params)
        for block, errors in checked:
            if block is not None and block.cid.raw in inconsistent:
                errors = [inconsistent[block.cid.raw]]
            if errors or block is None:
                outcomes.append(Outcome(block.cid if block else None, "invalid", tuple(errors)))
            elif block.cid.raw in seen or block.cid.raw in stored:
                outcomes.append(Outcome(block.cid, "duplicate"))
            else:
                seen.add(block.cid.raw)
                accepted.append(block)
                outcomes.append(Outcome(block.cid, ""))
        if accepted:
            statuses = self._store_and_fold(accepted)
            outcomes = [_with_status(o, statuses) for o in outcomes]
        return outcomes

    def _store_and_fold(self, blocks: list[Block]) -> dict[bytes, str]:
        txn = self.store.transaction()
        root = StateRoot(self._state_root.to_bytes())
        try:
            ready = []
            for block in blocks:
                cid = block.cid.raw
                meta = OpMeta.of(block.op)
                txn.put(BLOCK + cid, block.data)
                txn.put(OPMETA + cid, meta.encode())
                position = self.merkle.append(txn, cid)
                txn.put(BY_AUTHOR + block.op.author.encode() + b"\x00" + u64(position), cid)
                root.add(cid)
                waiting = [dep for dep in dict.fromkeys(meta.parents + meta.targets) if not self._applied(txn, dep)]
                if waiting:
                    txn.put(PENDING + cid, b"".join(waiting))
                    for dep in waiting:
                        txn.put(WAITER + dep + cid, b"")
                else:
                    ready.append(cid)
            applied = self._release(txn, ready)
            txn.put(_STATE_ROOT, root.to_bytes())
            if applied:
                txn.put(_GENERATION, u64(self.generation + 1))
            new_ops = {block.cid.raw: block.op for block in blocks}
            self.library.apply(
                txn,
                [(cid, new_ops[cid] if cid in new_ops else load_stored(txn.get(BLOCK + cid))) for cid in applied],
            )
            txn.commit()
        except BaseException:
            self.merkle.reload()
            self.library.reset()
            raise
        self._state_root = root
        self._index_pending |= self.library.touched
        self.library.touched.clear()
        if len(self._index_pending) > _INDEX_BACKLOG:
            self._catch_up_index()
        done = set(applied)
        return {block.cid.raw: "applied" if block.cid.raw in done else "pending" for block in blocks}

    def _applied(self, view: Store | Transaction, cid: bytes) -> bool:
        return view.get(OPMETA + cid) is not None and view.get(PENDING + cid) is None

    def _release(self, txn: Transaction, ready: list[bytes]) -> list[bytes]:
        """Mark `ready` applied and wake, transitively, every pending operation that waited only on them."""
        applied, queue = [], list(ready)
        while queue:
            cid = queue.pop()
            applied.append(cid)
            for key, _ in list(txn.scan(WAITER + cid)):
                waiter = key[1 + CID_LENGTH :]
                txn.delete(key)
                still = [d for d in _split(txn.get(PENDING + waiter) or b"") if d != cid]
                if still:
                    txn.put(PENDING + waiter, b"".join(still))
                else:
                    txn.delete(PENDING + waiter)
                    queue.append(waiter)
        return applied

    # --- the vector index ---------------------------------------------------------------------

    def _live_embeddings(self) -> Iterator[tuple[bytes, bytes, bytes]]:
        for record in self.library.experiences():
            if record["status"] == "live":
                version = record["version"].raw
                yield record["id"].raw, version, self.library.content(self.store, version).embedding.values

    @property
    def index(self) -> ExperienceIndex:
        """The vector index, first brought in line with every library change committed so far.

        Ingest only notes which experiences changed; the index catches up when it is next read
        (or when the backlog grows large), so many commits share one batched usearch insert.
        """
        if self._index_pending:
            self._catch_up_index()
        return self._index

    def _catch_up_index(self) -> None:
        live, removals = {}, []
        try:
            for exp_id in self._index_pending:
                record = self.library.record(self.store, exp_id)
                if record is None or record["status"] != "live":
                    removals.append(exp_id)
                elif not self._index.holds(exp_id, version := record["version"].raw):
                    live[exp_id] = (version, self.library.content(self.store, version).embedding.values)
            self._index.update(live, removals)
        except Exception:  # the library is durable already; an index that fell out of step is rebuilt
            log.exception("updating the vector index failed; rebuilding it")
            self.rebuild_index("an update failed")
        finally:
            self._index_pending.clear()
        self._index.generation = self.generation

    def rebuild_index(self, why: str = "requested") -> None:
        """Index every live experience from scratch, logging progress."""
        total = sum(1 for r in self.library.experiences() if r["status"] == "live")
        log.info("rebuilding the vector index (%s): %d live experiences", why, total)

        def progress(done: int, of: int) -> None:
            log.info("indexed %d/%d experiences", done, of)

        self._index.rebuild(self._live_embeddings(), total, self.generation, progress if total > 5000 else None)
        self.library.touched.clear()
        self._index_pending.clear()

    # --- queries -----------------------------------------------------------------------------

    def has(self, cid: CID) -> bool:
        return self.store.get(BLOCK + cid.raw) is not None

    def status(self, cid: CID) -> dict[str, Any] | None:
        """What the fold made of an operation, or {"outcome": "pending", "waiting_for": [...]}.

        An applied modify is shown as superseded once its experience is deleted (delete beats
        modify) or a later modify that saw it has replaced it.
        """
        pending = self.store.get(PENDING + cid.raw)
        if pending is not None:
            return {"outcome": "pending", "waiting_for": [CID(d) for d in _split(pending)]}
        raw = self.store.get(STATUS + cid.raw)
        if raw is None:
            return None
        status = codec.unpack(raw)
        if status["outcome"] == "applied" and self.library.meta(self.store, cid.raw).kind is Kind.MODIFY:
            record = self.experience(self.resolve(status["experience"]))
            assert record is not None
            if record["status"] == "deleted":
                return {**status, "outcome": "superseded", "code": "superseded.deleted"}
            if cid not in record["heads"]:
                return {**status, "outcome": "superseded", "code": "superseded.modified"}
        return status

    def pending(self) -> list[CID]:
        return [CID(key[1:]) for key, _ in self.store.scan(PENDING)]

    def missing(self) -> set[CID]:
        """CIDs that pending operations depend on and this node has never seen: what sync must fetch."""
        wanted = {key[1 : 1 + CID_LENGTH] for key, _ in self.store.scan(WAITER)}
        return {CID(raw) for raw in wanted if self.store.get(BLOCK + raw) is None}

    def experience(self, exp_id: CID) -> dict[str, Any] | None:
        return self.library.record(self.store, exp_id.raw)

    def resolve(self, exp_id: CID) -> CID:
        return CID(self.library.resolve(self.store, exp_id.raw))

    def live_ids(self, domain_prefix: str = "") -> list[CID]:
        """Live experiences whose domain equals `domain_prefix` or lies under it (all when empty)."""
        if not domain_prefix:
            return [r["id"] for r in self.library.experiences() if r["status"] == "live"]
        ids = []
        for prefix in (domain_prefix.encode() + b"\x00", domain_prefix.encode() + b"."):
            ids.extend(CID(key[-CID_LENGTH:]) for key, _ in self.store.scan(BY_DOMAIN + prefix))
        return ids

    def by_author(self, author: str) -> list[CID]:
        return [CID(value) for _, value in self.store.scan(BY_AUTHOR + author.encode() + b"\x00")]

    def by_target(self, target: CID) -> list[CID]:
        return [CID(key[-CID_LENGTH:]) for key, _ in self.store.scan(BY_TARGET + target.raw)]

    def applied_in_order(self) -> list[CID]:
        return [CID(key[9:]) for key, _ in self.store.scan(ORDER)]

    def state_root(self) -> bytes:
        return self._state_root.digest()

    def snapshot(self) -> bytes:
        return self.library.snapshot()

    # --- log and proofs ----------------------------------------------------------------------

    @property
    def log_size(self) -> int:
        return self.merkle.size

    def logged(self, position: int) -> CID:
        raw = self.store.get(LOG + u64(position))
        if raw is None:
            raise ProofError("proof.leaf", f"position {position} is not in the log (size {self.log_size})")
        return CID(raw)

    def position(self, cid: CID) -> int | None:
        raw = self.store.get(SEQ + cid.raw)
        return int.from_bytes(raw, "big") if raw is not None else None

    def tree_head(self) -> TreeHead:
        """A freshly signed head for the current log."""
        return TreeHead.sign(self.log_size, self.merkle.root(), self.node_key)

    def inclusion_proof(self, cid: CID, size: int | None = None) -> dict[str, Any]:
        position = self.position(cid)
        if position is None:
            raise ProofError("proof.unknown", f"{cid} is not in this node's log")
        size = self.log_size if size is None else size
        return {
            "cid": str(cid),
            "leaf_index": position,
            "tree_size": size,
            "leaf_hash": self.merkle.leaf_hash(position).hex(),
            "audit_path": [h.hex() for h in self.merkle.inclusion_path(position, size)],
            "root": self.merkle.root(size).hex(),
        }

    def consistency_proof(self, old_size: int, new_size: int | None = None) -> dict[str, Any]:
        new_size = self.log_size if new_size is None else new_size
        return {
            "old_size": old_size,
            "new_size": new_size,
            "old_root": self.merkle.root(old_size).hex(),
            "new_root": self.merkle.root(new_size).hex(),
            "proof": [h.hex() for h in self.merkle.consistency_path(old_size, new_size)],
        }

    # --- maintenance -------------------------------------------------------------------------

    def rebuild_library(self) -> None:
        """Fold every applied operation again from nothing: a clean rebuild of the library from the log."""
        applied = [key[9:] for key, _ in self.store.scan(ORDER)]
        log.info("rebuilding the library from %d applied operations", len(applied))
        txn = self.store.transaction()
        for table in (EXPERIENCE, BY_DOMAIN, STATUS, UNDO, ORDER, BY_TARGET, VOTES):
            for key, _ in self.store.scan(table):
                txn.delete(key)
        self.library.reset(empty=True)
        try:
            self.library.apply(
                txn,
                [(cid, load_stored(self.store.get(BLOCK + cid))) for cid in applied],
                lambda done, total: log.info("refolded %d/%d operations", done, total),
            )
            txn.put(_GENERATION, u64(self.generation + 1))
            txn.commit()
        except BaseException:
            self.library.reset()
            raise
        self.rebuild_index("the library was rebuilt")


def _check_network(store: Store, params: NetworkParams) -> None:
    """A data directory belongs to one network: refuse to open it with other network parameters.

    Validity, the fold and the index all depend on them (as a blockchain node checks its genesis).
    """
    wanted = dataclasses.asdict(params)
    raw = store.get(_NETWORK)
    if raw is None:
        store.write({_NETWORK: codec.encode(wanted)})
        return
    recorded = codec.decode(raw)
    differing = sorted(name for name in wanted.keys() | recorded.keys() if wanted.get(name) != recorded.get(name))
    if differing:
        details = ", ".join(f"{name} {recorded.get(name)!r} (asked {wanted.get(name)!r})" for name in differing)
        raise StoreError("store.network", f"{store.path}: this data directory belongs to another network: {details}")


def _split(raw: bytes) -> list[bytes]:
    return [raw[i : i + CID_LENGTH] for i in range(0, len(raw), CID_LENGTH)]


def _with_status(outcome: Outcome, statuses: dict[bytes, str]) -> Outcome:
    if outcome.status or outcome.cid is None:
        return outcome
    return Outcome(outcome.cid, statuses[outcome.cid.raw])
