"""State root: a digest of the SET of operations a node holds, updated in O(1) per operation.

A lattice-based homomorphic set hash (LtHash, as Meta uses for update propagation): each CID
expands to 1024 16-bit lanes, and the state is their lane-wise sum modulo 2^16. Sums commute, so
two nodes holding the same set have the same root whatever order the operations arrived in;
finding two sets with one sum is as hard as a short-vector lattice problem.
"""

from __future__ import annotations

import hashlib

import numpy as np

LANES = 1024
_DOMAIN = b"experience-ledger/lthash16/1"


def element(cid_raw: bytes) -> np.ndarray:
    """The group element of one CID: SHAKE-256 output read as little-endian uint16 lanes."""
    return np.frombuffer(hashlib.shake_256(_DOMAIN + cid_raw).digest(2 * LANES), dtype="<u2")


class StateRoot:
    """The running lane-wise sum; `digest` is what nodes compare."""

    def __init__(self, state: bytes | None = None) -> None:
        self._lanes = np.frombuffer(state, dtype="<u2").copy() if state else np.zeros(LANES, dtype="<u2")

    def add(self, cid_raw: bytes) -> None:
        self._lanes += element(cid_raw)  # uint16 arithmetic wraps: the sum is modulo 2^16

    def to_bytes(self) -> bytes:
        return self._lanes.tobytes()

    def digest(self) -> bytes:
        return hashlib.sha256(self.to_bytes()).digest()
