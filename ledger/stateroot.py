"""State root: a digest of the SET of operations a node holds, updated in O(1) per operation.

A multiplicative set hash (MuHash, as Bitcoin Core uses for its UTXO set): each CID maps to an
element of the group of integers modulo the prime 2^3072 - 1103717, and the state is their
product. Products commute, so two nodes holding the same set have the same root whatever order
the operations arrived in; finding two sets with one product is as hard as discrete logarithms.
"""

from __future__ import annotations

import hashlib

PRIME = 2**3072 - 1103717
_WIDTH = 384  # bytes in a group element


def _element(cid_raw: bytes) -> int:
    return int.from_bytes(hashlib.shake_256(b"experience-ledger/muhash/1" + cid_raw).digest(_WIDTH), "little") % PRIME


class StateRoot:
    """The running product; `digest` is what nodes compare."""

    def __init__(self, state: bytes | None = None) -> None:
        self.value = int.from_bytes(state, "little") if state else 1

    def add(self, cid_raw: bytes) -> None:
        self.value = self.value * _element(cid_raw) % PRIME

    def to_bytes(self) -> bytes:
        return self.value.to_bytes(_WIDTH, "little")

    def digest(self) -> bytes:
        return hashlib.sha256(self.to_bytes()).digest()
