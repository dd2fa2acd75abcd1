"""The near-duplicate candidate rule of PROTOCOL §7.6: hyperplanes and bands exactly as specified, and
trivial edits found by it with the real model."""

import hashlib

import numpy as np
import pytest

from ledger.embedder import embedder_for, pack_float16
from ledger.neardup import BANDS, BITS, band_keys, hyperplanes
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
