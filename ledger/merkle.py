"""The node's append-only log as an RFC 9162 Merkle tree in LevelDB, signed tree heads, and proofs.

pymerkle supplies the tree algorithms; this backend keeps every leaf hash and every perfect
subtree hash in LevelDB, written in the same transaction as the operation it logs. Any subtree
root is then O(log n) reads, and start-up reads only the stored size. Proofs are in RFC 9162
form (§2.1.3 inclusion, §2.1.4 consistency), so clients verify them without our code.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from pymerkle import BaseMerkleTree
from pymerkle.core import _inclusion_path_layout

from ledger import codec
from ledger.errors import LedgerError
from ledger.keys import AuthorKey, IdentityError, verify_signature
from ledger.store import LOG, META, NODE, SEQ, Store, StoreError, Transaction, u64

_SIZE_KEY = META + b"log_size"


class ProofError(LedgerError):
    """A proof asked for a leaf or sizes the log does not have."""


def _node_key(level: int, index: int) -> bytes:
    return NODE + bytes([level]) + u64(index)


class MerkleLog(BaseMerkleTree):
    """RFC 9162 tree whose leaves are the binary CIDs of logged operations, in log order."""

    def __init__(self, store: Store) -> None:
        super().__init__("sha256")
        self._store = store
        self._view: Store | Transaction = store
        self._size = self._stored_size()

    def _stored_size(self) -> int:
        raw = self._store.get(_SIZE_KEY)
        size = int.from_bytes(raw, "big") if raw else 0
        last_missing = size > 0 and self._store.get(LOG + u64(size - 1)) is None
        if last_missing or self._store.get(LOG + u64(size)) is not None:
            raise StoreError("store.corrupt", f"log size {size} disagrees with the stored log entries")
        return size

    @property
    def size(self) -> int:
        return self._size

    def append(self, txn: Transaction, cid_raw: bytes) -> int:
        """Log one operation in `txn`; returns its position (from 0)."""
        self._view = txn
        try:
            return self.append_entry(cid_raw) - 1
        finally:
            self._view = self._store

    def reload(self) -> None:
        """Forget appends of a transaction that was not committed."""
        self._size = self._stored_size()
        self.cache_clear()

    # --- pymerkle storage backend ----------------------------------------------------------

    def _encode_entry(self, data: bytes) -> bytes:
        return data

    def _store_leaf(self, data: bytes, digest: bytes) -> int:
        position, view = self._size, self._view
        assert isinstance(view, Transaction), "appends go through a transaction"
        view.put(LOG + u64(position), data)
        view.put(SEQ + data, u64(position))
        view.put(_node_key(0, position), digest)
        index, level, node = position, 0, digest
        while index & 1:  # this leaf completes perfect subtrees: store each of their roots
            node = self.hash_pair(view.get(_node_key(level, index - 1)), node)
            index, level = index >> 1, level + 1
            view.put(_node_key(level, index), node)
        self._size += 1
        view.put(_SIZE_KEY, u64(self._size))
        return self._size

    def _get_leaf(self, index: int) -> bytes:
        return self._view.get(_node_key(0, index - 1))

    def _get_leaves(self, offset: int, width: int) -> list[bytes]:
        return [self._view.get(_node_key(0, i)) for i in range(offset, offset + width)]

    def _get_size(self) -> int:
        return self._size

    def _get_subroot(self, offset: int, width: int) -> bytes:
        """A stored perfect subtree when the range is one (aligned), else computed from its leaves."""
        level = width.bit_length() - 1
        if offset % width == 0 and offset + width <= self._size:
            stored = self._view.get(_node_key(level, offset >> level))
            if stored is not None:
                return stored
        return self._get_subroot_uncached(offset, width)

    # --- RFC 9162 proofs --------------------------------------------------------------------

    def root(self, size: int | None = None) -> bytes:
        """MTH of the first `size` leaves (all by default)."""
        size = self._size if size is None else size
        self._check_size(size)
        return self._get_root(0, size)

    def leaf_hash(self, position: int) -> bytes:
        if not 0 <= position < self._size:
            raise ProofError("proof.leaf", f"position {position} is not in the log (size {self._size})")
        return self._get_leaf(position + 1)

    def inclusion_path(self, position: int, size: int) -> list[bytes]:
        """RFC 9162 §2.1.3.1 PATH(m, D[n]), sibling hashes from the leaf upwards."""
        self._check_size(size)
        if not 0 <= position < size:
            raise ProofError("proof.leaf", f"leaf {position} is not within tree size {size}")
        _, ranges = _inclusion_path_layout(position + 1, size)
        return [self._get_root(start, end) for start, end in ranges[1:]]

    def consistency_path(self, old_size: int, new_size: int) -> list[bytes]:
        """RFC 9162 §2.1.4.1 PROOF(m, D[n]) for 0 < m <= n."""
        self._check_size(new_size)
        if not 0 < old_size <= new_size:
            raise ProofError("proof.sizes", f"need 0 < old size ({old_size}) <= new size ({new_size})")
        return [self._get_root(start, end) for start, end in _subproof(old_size, 0, new_size, True)]

    def _check_size(self, size: int) -> None:
        if not 0 <= size <= self._size:
            raise ProofError("proof.sizes", f"tree size {size} is beyond the log (size {self._size})")


def _subproof(m: int, start: int, end: int, complete: bool) -> list[tuple[int, int]]:
    """RFC 9162 SUBPROOF(m, D[start:end], b) as the leaf ranges whose MTH make up the proof."""
    n = end - start
    if m == n:
        return [] if complete else [(start, end)]
    k = 1 << ((n - 1).bit_length() - 1)  # the largest power of two smaller than n
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
