"""Verifying RFC 9162 proofs: what a peer or client checks of another node's log.

Written from the RFC's text (§2.1.3.2 inclusion, §2.1.4.2 consistency), independently of the code
that builds the tree (`ledger.merkle`), so that each checks the other.
"""

from __future__ import annotations

import hashlib


def _node_hash(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(b"\x01" + left + right).digest()


def verify_inclusion(leaf: bytes, index: int, size: int, path: list[bytes], root: bytes) -> bool:
    """§2.1.3.2: `leaf` is the leaf hash, `index` counts from 0."""
    if not 0 <= index < size:
        return False
    fn, sn, r = index, size - 1, leaf
    for p in path:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            r = _node_hash(p, r)
            if not fn & 1:
                while fn & 1 == 0 and fn != 0:
                    fn >>= 1
                    sn >>= 1
        else:
            r = _node_hash(r, p)
        fn >>= 1
        sn >>= 1
    return sn == 0 and r == root


def verify_consistency(first: int, second: int, first_hash: bytes, second_hash: bytes, proof: list[bytes]) -> bool:
    """§2.1.4.2 for 0 < first <= second."""
    if first == second:
        return not proof and first_hash == second_hash
    if not proof or first <= 0 or first > second:
        return False
    path = list(proof)
    if first & (first - 1) == 0:  # a power of two: prepend first_hash
        path.insert(0, first_hash)
    fn, sn = first - 1, second - 1
    while fn & 1:
        fn >>= 1
        sn >>= 1
    fr = sr = path[0]
    for c in path[1:]:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            fr = _node_hash(c, fr)
            sr = _node_hash(c, sr)
            if not fn & 1:
                while fn & 1 == 0 and fn != 0:
                    fn >>= 1
                    sn >>= 1
        else:
            sr = _node_hash(sr, c)
        fn >>= 1
        sn >>= 1
    return sn == 0 and fr == first_hash and sr == second_hash
