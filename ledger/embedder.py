"""Embedders behind one small interface, and the float16 packing that operations carry."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from functools import lru_cache
from typing import Protocol

import numpy as np

from ledger.errors import LedgerError
from ledger.params import NetworkParams

_WORD = re.compile(r"\w+")


class EmbedderError(LedgerError):
    """The network's pinned embedding model cannot be provided here."""


class Embedder(Protocol):
    """Maps texts to float32 unit vectors of `dim` components; `model_id` names model, backend and precision."""

    model_id: str
    dim: int

    def embed(self, texts: Sequence[str]) -> np.ndarray: ...


class HashingEmbedder:
    """Deterministic feature hashing of words and character trigrams.

    Bit-for-bit identical on every machine (integer hashing, then one float32 normalisation),
    so it serves as the test embedder and for networks that want no model.
    """

    model_id = "feature-hash-v1"

    def __init__(self, dim: int = 256) -> None:
        self.dim = dim

    def _features(self, text: str) -> list[str]:
        words = _WORD.findall(text.lower())
        features = [f"w:{word}" for word in words]
        for word in words:
            padded = f"#{word}#"
            features.extend(f"c:{padded[i : i + 3]}" for i in range(len(padded) - 2))
        return features

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, text in enumerate(texts):
            counts = np.zeros(self.dim, dtype=np.int64)
            for feature in self._features(text):
                bucket, sign = _bucket(feature, self.dim)
                counts[bucket] += sign
            norm = np.sqrt(float(np.dot(counts, counts)))
            if norm:
                out[row] = (counts / norm).astype(np.float32)
        return out


@lru_cache(maxsize=1 << 18)
def _bucket(feature: str, dim: int) -> tuple[int, int]:
    """The bucket and sign of one feature (cached: words and trigrams repeat across texts)."""
    digest = int.from_bytes(hashlib.blake2b(feature.encode(), digest_size=8).digest(), "little")
    return digest % dim, 1 if digest >> 63 else -1


def embedder_for(params: NetworkParams) -> Embedder:
    """The network's pinned embedder; refuses a model this node cannot load."""
    if params.embedding_model == HashingEmbedder.model_id:
        return HashingEmbedder(params.embedding_dim)
    raise EmbedderError(
        "embedder.unavailable",
        f"the network pins embedding model {params.embedding_model!r}, which this node cannot load",
    )


def pack_float16(vector: np.ndarray) -> bytes:
    """float16, little-endian, one byte string: the embedding form inside an operation."""
    return np.asarray(vector, dtype="<f2").tobytes()


def unpack_float16(values: bytes) -> np.ndarray:
    """The float32 vector of a packed float16 embedding."""
    return np.frombuffer(values, dtype="<f2").astype(np.float32)
