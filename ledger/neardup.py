"""Near-duplicate candidates without scanning the library: locality-sensitive hashing fixed by the protocol.

Every node must reach the same verdict, so the candidate rule is part of the protocol
(docs/PROTOCOL.md §7.6): the hyperplanes come from SHAKE-256 of a fixed label and the embedding
model, each sign is computed exactly in integers, and the exact cosine test decides among the
candidates. Two embeddings at angle θ agree on one random hyperplane with probability 1 - θ/π; a
band of `BITS` hyperplanes collides with probability (1 - θ/π)^BITS, and a pair is a candidate when
any of `BANDS` bands collides. At the default near-duplicate threshold (cos 0.99, θ = 8.1°) a pair
is missed with probability (1 - 0.955^32)^32 = 2.4e-4, at cos 0.996 (trivial edits) with 3e-7;
unrelated experiences collide rarely (bench/bench_neardup.py measures both).
"""

from __future__ import annotations

import hashlib
import operator
import struct
from collections.abc import Sequence
from fractions import Fraction
from functools import lru_cache

import numpy as np

BITS = 32  # hyperplanes per band: a band's hash is one unsigned 32-bit integer
BANDS = 32
_LABEL = b"experience-ledger/lsh/1"
_BAND = struct.Struct(">BI")  # band number, band hash
BAND_KEY_SIZE = _BAND.size  # bytes of a band key


@lru_cache(maxsize=4)
def hyperplanes(model: str, dim: int) -> np.ndarray:
    """(dim, BITS * BANDS) entries of +1 or -1, one bit of SHAKE-256(label ‖ model ‖ dim) each."""
    seed = _LABEL + model.encode() + b"\x00" + dim.to_bytes(4, "big")
    count = dim * BITS * BANDS
    bits = np.unpackbits(np.frombuffer(hashlib.shake_256(seed).digest(count // 8), dtype=np.uint8))
    return (bits.astype(np.int64) * 2 - 1).reshape(dim, BITS * BANDS)


def scaled(values: bytes) -> np.ndarray:
    """float16 values as exact integers (each is a multiple of 2^-24)."""
    return (np.frombuffer(values, dtype="<f2").astype(np.float64) * (1 << 24)).astype(np.int64)


def band_keys(values: bytes, model: str, dim: int) -> list[bytes]:
    """The BANDS band keys (band number, band hash) of a float16 embedding (see `band_keys_of_many`)."""
    return band_keys_of_many([values], model, dim)[0]


def band_keys_of_many(embeddings: Sequence[bytes], model: str, dim: int) -> list[list[bytes]]:
    """The band keys of each float16 embedding; bit i of a band is the sign of the exact dot product with
    hyperplane i (a zero product counts as positive).

    The products are computed in float64, and are exact: every float16 is a multiple of 2^-24 below
    2^16 in magnitude, so with at most 8,192 terms every partial sum is a multiple of 2^-24 below
    2^29, which float64's 53 bits represent exactly, whatever the order of summation. So a batch's
    adds share one matrix product, which reads the hyperplanes once: with 256 dimensions ~50-90 us
    of CPU per embedding in batches of 250, against ~80-110 us one at a time.
    """
    if not embeddings:
        return []
    rows = np.frombuffer(b"".join(embeddings), dtype="<f2").reshape(len(embeddings), dim).astype(np.float64)
    signs = (rows @ _planes(model, dim)) >= 0
    hashes = (signs.reshape(len(embeddings), BANDS, BITS).astype(np.uint64) * _BIT_WEIGHTS).sum(axis=2)
    return [[_BAND.pack(band, value) for band, value in enumerate(row)] for row in hashes.tolist()]


_BIT_WEIGHTS = np.left_shift(np.uint64(1), np.arange(BITS, dtype=np.uint64))


@lru_cache(maxsize=4)
def _planes(model: str, dim: int) -> np.ndarray:
    return hyperplanes(model, dim).astype(np.float64)


#: a float64 cosine is within ~1e-13 of the true one on any machine; only closer calls need integers
_FLOAT_MARGIN = 1e-9


def exact_cosine_exceeds(a: bytes, b: bytes, threshold: Fraction) -> bool:
    """cos(a, b) > threshold for float16 vectors, decided exactly (identical on every machine).

    A float64 cosine decides when it is clearly on one side; otherwise integers do: every float16
    is an integer multiple of 2^-24, so scaled values, their dot product and norms are exact
    integers, and cos > p/q  <=>  dot > 0 and q²·dot² > p²·|a|²·|b|² (for p/q >= 0).
    """
    fa, fb = np.frombuffer(a, dtype="<f2").astype(np.float64), np.frombuffer(b, dtype="<f2").astype(np.float64)
    norms = float(np.sqrt(fa @ fa) * np.sqrt(fb @ fb))
    if norms > 0:
        approximate = float(fa @ fb) / norms
        if abs(approximate - float(threshold)) > _FLOAT_MARGIN:
            return approximate > float(threshold)
    ints_a, ints_b = scaled(a).tolist(), scaled(b).tolist()
    dot = sum(map(operator.mul, ints_a, ints_b))
    if dot <= 0:
        return False
    norm_a = sum(x * x for x in ints_a)
    norm_b = sum(x * x for x in ints_b)
    p, q = threshold.numerator, threshold.denominator
    return q * q * dot * dot > p * p * norm_a * norm_b


def exact_cosines_exceed(a: bytes, others: Sequence[bytes], threshold: Fraction) -> list[bool]:
    """`exact_cosine_exceeds(a, b, threshold)` for each b of `others`, with the float64 cosines from one matrix
    product: a late add that takes over a cluster tests thousands (~11 us each one at a time). The verdicts are
    the same: a float64 cosine decides only when it is clearly on one side, whatever the order of its sums."""
    if not others:
        return []
    fa = np.frombuffer(a, dtype="<f2").astype(np.float64)
    rows = np.frombuffer(b"".join(others), dtype="<f2").astype(np.float64).reshape(len(others), fa.size)
    norms = np.sqrt(np.einsum("ij,ij->i", rows, rows)) * np.sqrt(fa @ fa)
    with np.errstate(divide="ignore", invalid="ignore"):
        approximate = (rows @ fa) / norms
    limit = float(threshold)
    decided = (norms > 0) & (np.abs(approximate - limit) > _FLOAT_MARGIN)
    return [
        bool(above) if clear else exact_cosine_exceeds(a, other, threshold)
        for above, clear, other in zip((approximate > limit).tolist(), decided.tolist(), others, strict=True)
    ]
