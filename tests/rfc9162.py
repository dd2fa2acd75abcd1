"""An independent RFC 9162 verifier, written from the RFC's text (§2.1.3.2, §2.1.4.2), not from pymerkle."""

import hashlib


def leaf_hash(entry: bytes) -> bytes:
    return hashlib.sha256(b"\x00" + entry).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(b"\x01" + left + right).digest()


def mth(entries: list[bytes]) -> bytes:
    """The Merkle Tree Hash of §2.1.1, straight from its recursive definition."""
    n = len(entries)
    if n == 0:
        return hashlib.sha256(b"").digest()
    if n == 1:
        return leaf_hash(entries[0])
    k = 1
    while k * 2 < n:
        k *= 2
    return node_hash(mth(entries[:k]), mth(entries[k:]))


def verify_inclusion(leaf: bytes, index: int, size: int, path: list[bytes], root: bytes) -> bool:
    """§2.1.3.2: `leaf` is the leaf hash, `index` counts from 0."""
    if index >= size:
        return False
    fn, sn, r = index, size - 1, leaf
    for p in path:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            r = node_hash(p, r)
            if not fn & 1:
                while fn & 1 == 0 and fn != 0:
                    fn >>= 1
                    sn >>= 1
        else:
            r = node_hash(r, p)
        fn >>= 1
        sn >>= 1
    return sn == 0 and r == root


def verify_consistency(first: int, second: int, first_hash: bytes, second_hash: bytes, proof: list[bytes]) -> bool:
    """§2.1.4.2 for 0 < first <= second."""
    if first == second:
        return not proof and first_hash == second_hash
    if not proof or first == 0 or first > second:
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
            fr = node_hash(c, fr)
            sr = node_hash(c, sr)
            if not fn & 1:
                while fn & 1 == 0 and fn != 0:
                    fn >>= 1
                    sn >>= 1
        else:
            sr = node_hash(sr, c)
        fn >>= 1
        sn >>= 1
    return sn == 0 and fr == first_hash and sr == second_hash
