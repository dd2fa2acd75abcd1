"""The node's append-only log as an RFC 9162 Merkle tree stored in LevelDB, and signed tree heads.

RFC 9162 §2.1 is short, so the tree is written here: every leaf hash and every perfect subtree
hash is stored in the same transaction as the operation it logs, so the root or a proof for any
size is O(log n) reads and start-up reads only the stored size. A `LogAppender` writes inside one
transaction and keeps its own cursor; a `MerkleLog` reads the first `size` entries of one view.
Nothing here is shared state, so a log read from a committed view never sees a batch being built.
Proofs are in RFC 9162 form (§2.1.3 inclusion, §2.1.4 consistency); `ledger.proofs` verifies them.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ledger import codec
from ledger.errors import LedgerError
from ledger.keys import AuthorKey, IdentityError, verify_signature
from ledger.store import ReadView, StoreError, Transaction
from ledger.tables import LOG_SIZE, log_key, merkle_node_key, seq_key, u64

EMPTY_ROOT = hashlib.sha256(b"").digest()


class ProofError(LedgerError):
    """A proof asked for a leaf or sizes the log does not have."""


def leaf_hash(entry: bytes) -> bytes:
    """RFC 9162 §2.1.1: SHA-256(0x00 ‖ entry)."""
    return hashlib.sha256(b"\x00" + entry).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    """RFC 9162 §2.1.1: SHA-256(0x01 ‖ left ‖ right)."""
    return hashlib.sha256(b"\x01" + left + right).digest()


def _split(width: int) -> int:
    """The largest power of two smaller than `width` (> 1): where RFC 9162 splits a range."""
    return 1 << ((width - 1).bit_length() - 1)


class Frontier:
    """The perfect subtrees that cover the first `size` leaves of a log (a "compact range"): enough to append
    leaves and compute the root at every size after it, without the leaves before. A node reading another
    node's log keeps one per peer, so each page it reads can be checked against that peer's signed head."""

    def __init__(self, size: int = 0, subtrees: Iterable[bytes] = ()) -> None:
        self.size = size
        levels = [bit for bit in range(size.bit_length() - 1, -1, -1) if size >> bit & 1]
        hashes = list(subtrees)
        if len(hashes) != len(levels):
            raise ProofError(
                "proof.frontier", f"a frontier of size {size} has {len(levels)} subtrees, not {len(hashes)}"
            )
        self._stack: list[tuple[int, bytes]] = list(zip(levels, hashes, strict=True))  # largest first: (level, hash)

    @property
    def subtrees(self) -> list[bytes]:
        return [node for _, node in self._stack]

    def append(self, leaf: bytes) -> None:
        """Add one leaf hash."""
        level, node = 0, leaf
        while self._stack and self._stack[-1][0] == level:
            node = node_hash(self._stack.pop()[1], node)
            level += 1
        self._stack.append((level, node))
        self.size += 1

    def root(self) -> bytes:
        if not self._stack:
            return EMPTY_ROOT
        root = self._stack[-1][1]
        for _, node in reversed(self._stack[:-1]):
            root = node_hash(node, root)
        return root

    def copy(self) -> Frontier:
        return Frontier(self.size, self.subtrees)


def root_of_leaf_hashes(leaves: Iterable[bytes]) -> bytes:
    """MTH computed from the leaf hashes alone, without any stored inner node (for verification)."""
    frontier = Frontier()
    for leaf in leaves:
        frontier.append(leaf)
    return frontier.root()


def stored_size(view: ReadView) -> int:
    """The log size a store records, checked against its log entries (start-up reads nothing else)."""
    raw = view.get(LOG_SIZE)
    size = int.from_bytes(raw, "big") if raw else 0
    if (size > 0 and view.get(log_key(size - 1)) is None) or view.get(log_key(size)) is not None:
        raise StoreError("store.corrupt", f"log size {size} disagrees with the stored log entries")
    return size


class LogAppender:
    """Appends entries inside one transaction; its cursor is private to the batch until that commits."""

    def __init__(self, txn: Transaction, size: int) -> None:
        self._txn = txn
        self.size = size

    def append(self, cid_raw: bytes) -> int:
        """Log one operation; returns its position (from 0)."""
        position, txn = self.size, self._txn
        txn.put(log_key(position), cid_raw)
        txn.put(seq_key(cid_raw), u64(position))
        node = leaf_hash(cid_raw)
        txn.put(merkle_node_key(0, position), node)
        index, level = position, 0
        while index & 1:  # this leaf completes perfect subtrees: store each of their roots
            left = txn.get(merkle_node_key(level, index - 1))
            assert left is not None, "a completed subtree's left half is stored"
            node = node_hash(left, node)
            index, level = index >> 1, level + 1
            txn.put(merkle_node_key(level, index), node)
        self.size += 1
        txn.put(LOG_SIZE, u64(self.size))
        return position


class MerkleLog:
    """Roots and RFC 9162 proofs over the first `size` entries of the log in `view`."""

    def __init__(self, view: ReadView, size: int) -> None:
        self._view = view
        self.size = size

    def _node(self, level: int, index: int) -> bytes:
        found = self._view.get(merkle_node_key(level, index))
        if found is None:
            raise StoreError("store.corrupt", f"the Merkle node at level {level}, index {index} is missing")
        return found

    def _subtree(self, start: int, end: int) -> bytes:
        """MTH(D[start:end]); every perfect subtree the RFC recursion meets is aligned, hence stored."""
        width = end - start
        if width & (width - 1) == 0:
            level = width.bit_length() - 1
            return self._node(level, start >> level)
        k = _split(width)
        return node_hash(self._subtree(start, start + k), self._subtree(start + k, end))

    def root(self, size: int | None = None) -> bytes:
        """MTH of the first `size` leaves (all by default)."""
        size = self.size if size is None else size
        self._check_size(size)
        return self._subtree(0, size) if size else EMPTY_ROOT

    def leaf_hash(self, position: int) -> bytes:
        if not 0 <= position < self.size:
            raise ProofError("proof.leaf", f"position {position} is not in the log (size {self.size})")
        return self._node(0, position)

    def inclusion_path(self, position: int, size: int) -> list[bytes]:
        """RFC 9162 §2.1.3.1 PATH(m, D[n]), sibling hashes from the leaf upwards."""
        self._check_size(size)
        if not 0 <= position < size:
            raise ProofError("proof.leaf", f"leaf {position} is not within tree size {size}")
        path: list[bytes] = []
        start, end = 0, size
        while end - start > 1:
            k = _split(end - start)
            if position < start + k:
                path.append(self._subtree(start + k, end))
                end = start + k
            else:
                path.append(self._subtree(start, start + k))
                start += k
        path.reverse()
        return path

    def consistency_path(self, old_size: int, new_size: int) -> list[bytes]:
        """RFC 9162 §2.1.4.1 PROOF(m, D[n]) for 0 < m <= n."""
        self._check_size(new_size)
        if not 0 < old_size <= new_size:
            raise ProofError("proof.sizes", f"need 0 < old size ({old_size}) <= new size ({new_size})")
        return [self._subtree(start, end) for start, end in _subproof(old_size, 0, new_size, True)]

    def _check_size(self, size: int) -> None:
        if not 0 <= size <= self.size:
            raise ProofError("proof.sizes", f"tree size {size} is beyond the log (size {self.size})")


def _subproof(m: int, start: int, end: int, complete: bool) -> list[tuple[int, int]]:
    """RFC 9162 SUBPROOF(m, D[start:end], b) as the leaf ranges whose MTH make up the proof."""
    n = end - start
    if m == n:
        return [] if complete else [(start, end)]
    k = _split(n)
    if m <= k:
        return [*_subproof(m, start, start + k, complete), (start + k, end)]
    return [*_subproof(m - k, start + k, end, False), (start, start + k)]


@dataclass(frozen=True, slots=True)
class TreeHead:
    """A signed tree head: this node vouches that its log had `size` leaves with `root` at `timestamp` (ms)."""

    size: int
    root: bytes
    timestamp: int
    node: str
    signature: bytes = field(default=b"", repr=False)

    def record(self, signed: bool = True) -> dict[str, Any]:
        rec: dict[str, Any] = {"size": self.size, "root": self.root, "timestamp": self.timestamp, "node": self.node}
        if signed:
            rec["signature"] = self.signature
        return rec

    def signing_bytes(self) -> bytes:
        return codec.encode(self.record(signed=False))

    @classmethod
    def sign(cls, size: int, root: bytes, key: AuthorKey, timestamp: int | None = None) -> TreeHead:
        unsigned = cls(size, root, int(time.time() * 1000) if timestamp is None else timestamp, key.did)
        return cls(unsigned.size, unsigned.root, unsigned.timestamp, key.did, key.sign(unsigned.signing_bytes()))

    def verify(self) -> bool:
        try:
            return verify_signature(self.node, self.signing_bytes(), self.signature)
        except IdentityError:
            return False

    def to_bytes(self) -> bytes:
        return codec.encode(self.record())

    @classmethod
    def from_bytes(cls, data: bytes) -> TreeHead:
        """A signed tree head from its DAG-CBOR form; raises LedgerError('head.format') for anything else."""
        try:
            rec = codec.decode(data)
        except LedgerError as exc:
            raise LedgerError("head.format", f"not a signed tree head ({exc.message})") from None
        fields = {"size": int, "root": bytes, "timestamp": int, "node": str, "signature": bytes}
        if type(rec) is not dict or rec.keys() != fields.keys():
            raise LedgerError("head.format", f"a signed tree head has exactly the fields {', '.join(fields)}")
        for name, kind in fields.items():
            if type(rec[name]) is not kind:
                raise LedgerError("head.format", f"{name}: expected {kind.__name__}, got {type(rec[name]).__name__}")
        return cls(rec["size"], rec["root"], rec["timestamp"], rec["node"], rec["signature"])

    def to_json(self) -> dict[str, Any]:
        return {
            "size": self.size,
            "root": self.root.hex(),
            "timestamp": self.timestamp,
            "node": self.node,
            "signature": self.signature.hex(),
        }
