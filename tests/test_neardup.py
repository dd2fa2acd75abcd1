"""The near-duplicate candidate rule of PROTOCOL §7.6: hyperplanes and bands exactly as specified, and
trivial edits found by it with the real model."""

import hashlib
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ledger.embedder import embedder_for, pack_float16
from ledger.neardup import (
    _BAND,
    BANDS,
    BITS,
    band_keys,
    band_keys_of_many,
    exact_cosine_exceeds,
    exact_cosines_exceed,
    hyperplanes,
    scaled,
)
from ledger.params import NetworkParams

WORDLLAMA = "wordllama-l2supercat-256-numpy"


def test_hyperplanes_are_the_specified_shake_256_bits():
    matrix = hyperplanes(WORDLLAMA, 256)
    assert matrix.shape == (256, BITS * BANDS)
    stream = hashlib.shake_256(b"experience-ledger/lsh/1" + WORDLLAMA.encode() + b"\x00" + (256).to_bytes(4, "big"))
    first = stream.digest(2)
    expected = [1 if first[i // 8] >> (7 - i % 8) & 1 else -1 for i in range(16)]  # most significant bit first
    assert matrix[0, :16].tolist() == expected
    assert not np.array_equal(hyperplanes("another-model", 256)[:4], matrix[:4])


def test_band_keys_are_pinned():
    """Another implementation must compute these bytes: a change here is a change of protocol."""
    ramp = np.arange(1, 257, dtype=np.float32)
    values = pack_float16(ramp / np.linalg.norm(ramp))
    assert [key.hex() for key in band_keys(values, "feature-hash-v1", 256)[:4]] == [
        "00bed92efe",
        "01c1a657eb",
        "024c757473",
        "03f194629f",
    ]
    sine = pack_float16(np.sin(np.arange(256, dtype=np.float32)))
    assert [key.hex() for key in band_keys(sine, WORDLLAMA, 256)[:4]] == [
        "00eff66a8c",
        "0144062418",
        "02fd6237e7",
        "03b64e2ab2",
    ]


def _exact_band_keys(values: bytes, model: str, dim: int) -> list[bytes]:
    """§7.6 in integers: each float16 times 2^24 is an exact integer, and so is every dot product."""
    signs = (scaled(values) @ hyperplanes(model, dim)) >= 0
    return [_BAND.pack(band, sum(1 << bit for bit in range(BITS) if signs[band * BITS + bit])) for band in range(BANDS)]


#: float16 bit patterns at the edges: the smallest subnormals, the largest finite values, the smallest normals
_EDGES = st.sampled_from([0x0001, 0x8001, 0x03FF, 0x0400, 0x8400, 0x7BFF, 0xFBFF, 0x8000])


@st.composite
def _embeddings(draw: st.DrawFn) -> bytes:
    """Random float16 vectors (any finite bit pattern, some at the edges of the range), and vectors whose products
    with some hyperplanes are exactly zero or tiny. The 256 values are drawn as 512 bytes at once: drawn as 256
    integers, making them was nearly all of these tests' time."""
    bits = np.frombuffer(draw(st.binary(min_size=512, max_size=512)), dtype="<u2").copy()
    bits[(bits >> 10) & 0x1F == 0x1F] ^= 0x4000  # an infinity or NaN (exponent 31) becomes a finite value (15)
    for position, edge in draw(st.lists(st.tuples(st.integers(0, 255), _EDGES), max_size=8)):
        bits[position] = edge
    raw = bits.view("<f2").copy()
    if draw(st.booleans()):  # one value repeated where a hyperplane has +1 and -1 alike: its product cancels
        plane = hyperplanes("feature-hash-v1", 256)[:, draw(st.integers(0, BITS * BANDS - 1))]
        value = np.float16(draw(st.sampled_from([1.0, 2.0**-24, 65504.0, 0.333])))
        raw[:] = 0
        plus, minus = np.flatnonzero(plane > 0), np.flatnonzero(plane < 0)
        count = min(len(plus), len(minus))
        raw[plus[:count]] = value
        raw[minus[:count]] = value
        raw[draw(st.integers(0, 255))] = np.float16(draw(st.sampled_from([0.0, 2.0**-24, -(2.0**-24)])))
    return raw.astype("<f2").tobytes()


@settings(max_examples=60, deadline=None)
@given(st.lists(_embeddings(), min_size=1, max_size=5))
def test_band_keys_of_a_batch_are_each_embeddings_exact_band_keys(embeddings):
    """One matrix product for a batch's adds must give every node the keys §7.6 defines, bit for bit."""
    expected = [_exact_band_keys(values, "feature-hash-v1", 256) for values in embeddings]
    assert band_keys_of_many(embeddings, "feature-hash-v1", 256) == expected
    assert [band_keys(values, "feature-hash-v1", 256) for values in embeddings] == expected


@settings(max_examples=60, deadline=None)
@given(
    _embeddings(),
    st.lists(_embeddings(), max_size=6),
    st.sampled_from([Fraction(9, 10), Fraction(99, 100), Fraction(1)]),
)
def test_cosines_of_many_are_each_pairs_exact_verdict(values, others, threshold):
    """A takeover tests thousands of adds at once; each verdict must be the pair's exact one (§7.6), also for a copy
    (cosine 1, on the bound of threshold 1) and the zero vector."""
    others = [*others, values, bytes(len(values))]
    assert exact_cosines_exceed(values, others, threshold) == [
        exact_cosine_exceeds(values, other, threshold) for other in others
    ]


@pytest.mark.parametrize(
    "text",
    [
        "When solving geometry problems with intersections, validate solutions lie within bounded regions.",
        "For expected extreme statistics in combinatorial problems, use direct enumeration for small sizes.",
        "When using mathematical invariants to prove impossibility, validate them against small cases.",
        "For complex polynomials with real parameters, separate real and imaginary parts.",
    ],
)
def test_trivial_edits_share_a_band(text):
    embedder = embedder_for(NetworkParams())
    edits = [text.rstrip("."), text.replace(", ", "; ", 1), text.replace(" with ", " with the ", 1), text + " "]
    vectors = [pack_float16(v) for v in embedder.embed([text, *edits])]
    original = set(band_keys(vectors[0], WORDLLAMA, 256))
    for edit, vector in zip(edits, vectors[1:], strict=True):
        assert original & set(band_keys(vector, WORDLLAMA, 256)), edit
