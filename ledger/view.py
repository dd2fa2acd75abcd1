"""Reads of one committed state of a ledger: safe from any thread while the writer ingests, never torn.

A `LedgerView` reads a LevelDB snapshot that the writer published after a commit, so its log
size, Merkle root, state root, statuses and records all describe the same moment: a tree head
from a view always matches the log it describes.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from ledger.cid import CID
from ledger.keys import AuthorKey
from ledger.library import Library, OpMeta
from ledger.merkle import MerkleLog, ProofError, TreeHead
from ledger.ops import Block, Experience, Kind, load_stored
from ledger.records import ExperienceRecord, Life, OpStatus, Outcome, Vote
from ledger.stateroot import StateRoot
from ledger.store import ReadView, StoreError
from ledger.tables import (
    BLOCK,
    GENERATION,
    HEAD,
    LOG,
    LOG_SIZE,
    PENDING,
    STATE_ROOT,
    WAITER,
    block_key,
    by_author_prefix,
    cid_of_head_key,
    cid_of_key,
    log_key,
    parse_waiter_key,
    pending_key,
    read_u64,
    seq_key,
    split_cids,
)


class LedgerView:
    """Everything a query needs, read from one committed state."""

    def __init__(
        self,
        view: ReadView,
        library: Library,
        node_key: AuthorKey,
        max_parents: int,
        on_sign: Callable[[TreeHead], None] | None = None,
    ) -> None:
        self._view = view
        self._library = library
        self._node_key = node_key
        self._max_parents = max_parents
        self._on_sign = on_sign  # told of every head before it is handed out (the ledger keeps its mark)
        self.log_size = read_u64(view.get(LOG_SIZE))
        #: bumped by every committed change to the library
        self.generation = read_u64(view.get(GENERATION))
        self.merkle = MerkleLog(view, self.log_size)

    # --- operations ------------------------------------------------------------------------------

    def has(self, cid: CID) -> bool:
        return self._view.get(block_key(cid.raw)) is not None

    def block(self, cid: CID) -> Block | None:
        data = self._view.block(cid.raw)
        return Block(load_stored(data), data, cid) if data is not None else None

    def block_bytes(self, cid: CID) -> bytes | None:
        """A stored operation's bytes (checked against its CID), not decoded: what a peer fetching it receives
        (decoding each took ~50 us of a serving peer's CPU, on the cores the fetching node shares)."""
        return self._view.block(cid.raw)

    def status(self, cid: CID) -> OpStatus | None:
        """What the fold made of an operation; None when this node does not hold it.

        An applied modify is shown as superseded once its experience is deleted (delete beats
        modify) or a later modify that saw it has replaced it.
        """
        # the verdict first: a folded operation is never pending; its verdict is usually still in the memtable,
        # while a lookup of its absent pending key goes through every level (and charges seek compaction)
        status = self._library.status(self._view, cid.raw)
        if status is None:
            pending = self._view.get(pending_key(cid.raw))
            if pending is None:
                return None
            return OpStatus(Outcome.PENDING, waiting_for=tuple(CID(raw) for raw in split_cids(pending)))
        if status.outcome is not Outcome.APPLIED:
            return status
        if self._library.meta(self._view, cid.raw).kind is not Kind.MODIFY:
            return status
        assert status.experience is not None
        record = self.experience(self.resolve(status.experience))
        assert record is not None
        if record.status is Life.DELETED:
            return OpStatus(
                Outcome.SUPERSEDED, status.experience, code="superseded.deleted", reason="its experience was deleted"
            )
        if cid not in record.heads:
            return OpStatus(
                Outcome.SUPERSEDED,
                status.experience,
                code="superseded.modified",
                reason="a later modify that saw it replaced it",
            )
        return status

    def pending(self) -> list[CID]:
        return [CID(cid_of_key(key)) for key, _ in self._view.scan(PENDING)]

    def missing(self) -> set[CID]:
        """CIDs that pending operations depend on and this node has never seen: what sync must fetch."""
        wanted = {parse_waiter_key(key)[0] for key, _ in self._view.scan(WAITER)}
        return {CID(raw) for raw in wanted if self._view.get(block_key(raw)) is None}

    def by_author(self, author: str) -> list[CID]:
        return [CID(value) for _, value in self._view.scan(by_author_prefix(author))]

    def by_target(self, target: CID) -> list[CID]:
        return [CID(raw) for raw in self._library.naming(self._view, target.raw)]

    def applied_in_order(self) -> list[CID]:
        return [CID(raw) for raw in self._library.applied_in_order(self._view)]

    # --- building on this state ------------------------------------------------------------------

    def heads(self, limit: int | None = None) -> list[CID]:
        """Applied operations that no applied operation names as a parent (the frontier of the DAG), newest
        first: highest clock, ties by binary CID; the first `limit` of them when given."""
        keys = itertools.islice(self._view.scan(HEAD), limit)
        return [CID(cid_of_head_key(key)) for key, _ in keys]

    def clock(self, cid: CID) -> int:
        return self._held_meta(cid).clock

    def kind(self, cid: CID) -> Kind:
        return self._held_meta(cid).kind

    def _held_meta(self, cid: CID) -> OpMeta:
        """The metadata of an operation this view holds (KeyError if none): the library's cache also holds
        operations committed after the view and ones the writer is folding now."""
        return self._library.meta(self._view, cid.raw, cached=False)

    def parents_and_clock(self, targets: Sequence[CID] = ()) -> tuple[tuple[CID, ...], int]:
        """Parents and clock for a new operation on `targets` that takes effect (docs/PROTOCOL.md §7.4).

        The parents are the heads (the target experiences' concurrent modifies first, so a modify
        made here resolves a conflict), as many as the network allows; the clock exceeds every
        parent's and target's.
        """
        preferred = [head for target in targets if (record := self.experience(target)) for head in record.heads]
        heads = self.heads(len(preferred) + self._max_parents)  # enough once the preferred are taken out
        parents = list(dict.fromkeys([*preferred, *heads]))[: self._max_parents]
        clock = 1 + max((self.clock(cid) for cid in [*parents, *targets]), default=0)
        return tuple(sorted(parents)), clock

    # --- the library -----------------------------------------------------------------------------

    def experience(self, exp_id: CID) -> ExperienceRecord | None:
        return self._library.record(self._view, exp_id.raw)

    def resolve(self, exp_id: CID) -> CID:
        """The experience that stands for `exp_id` now (following merges and absorptions)."""
        return CID(self._library.resolve(self._view, exp_id.raw))

    def content(self, version: CID) -> Experience:
        """The experience an add, modify or merge carries."""
        return self._library.content(self._view, version.raw)

    def votes(self, exp_id: CID) -> dict[str, Vote]:
        return self._library.votes(self._view, exp_id.raw)

    def experiences(self, start: CID | None = None) -> Iterator[ExperienceRecord]:
        """Every experience record in id order, from `start` on, read as the caller goes."""
        return self._library.experiences(self._view, start.raw if start else None)

    def live_ids(self, domain_prefix: str = "") -> list[CID]:
        """Live experiences whose domain equals `domain_prefix` or lies under it (all when empty)."""
        if not domain_prefix:
            return [record.id for record in self._library.experiences(self._view) if record.live]
        return [
            CID(raw)
            for subdomains in (False, True)
            for raw in self._library.in_domain(self._view, domain_prefix, subdomains=subdomains)
        ]

    def snapshot(self) -> bytes:
        return self._library.snapshot(self._view)

    # --- state root, log and proofs ----------------------------------------------------------------

    def state_root(self) -> bytes:
        return StateRoot(self._view.get(STATE_ROOT)).digest()

    def logged(self, position: int) -> CID:
        raw = self._view.get(log_key(position)) if 0 <= position < self.log_size else None
        if raw is None:
            raise ProofError("proof.leaf", f"position {position} is not in the log (size {self.log_size})")
        return CID(raw)

    def entries(self, start: int, end: int) -> list[bytes]:
        """The operations at log positions [start, end), as stored (what a peer reading this log receives)."""
        if not 0 <= start <= end <= self.log_size:
            raise ProofError("proof.range", f"entries [{start}, {end}) are not in the log (size {self.log_size})")
        found = []
        for position in range(start, end):
            cid = self._view.get(log_key(position))
            data = self._view.block(cid) if cid is not None else None
            if data is None:
                raise StoreError("store.corrupt", f"log position {position} names no stored operation")
            found.append(data)
        return found

    def logged_cids(self, start: int, end: int) -> list[bytes]:
        """The binary CIDs at log positions [start, end) (clamped to the log), read in one scan."""
        end = min(end, self.log_size)
        if start >= end:
            return []
        return [cid for _, cid in itertools.islice(self._view.scan(LOG, log_key(start)), end - start)]

    def held_between(self, low: bytes, high: bytes, limit: int) -> list[tuple[int, bytes]]:
        """(clock, binary CID) of the operations held whose binary CID lies in [low, high), in CID order, at most
        `limit` of them: what set reconciliation lists of one range (p2p/reconcile.py)."""
        found = []
        for key, _ in itertools.islice(self._view.scan(BLOCK, block_key(low)), limit):
            cid = key[len(BLOCK) :]
            if cid >= high:
                break
            found.append((self._held_meta(CID(cid)).clock, cid))
        return found

    def position(self, cid: CID) -> int | None:
        raw = self._view.get(seq_key(cid.raw))
        return read_u64(raw) if raw is not None else None

    def tree_head(self) -> TreeHead:
        """A freshly signed head for this state's log."""
        head = TreeHead.sign(self.log_size, self.merkle.root(), self._node_key)
        if self._on_sign is not None:
            self._on_sign(head)
        return head

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
