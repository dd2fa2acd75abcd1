"""Embedders behind one small interface, and the float16 packing that operations carry.

The network pins one model (`NetworkParams.embedding_model`); every node re-embeds every
received text to check the embedding it carries, so the default is chosen for speed as well as
quality (see the README: WordLlama embeds ~30k texts/s here, MiniLM ~200).
"""

from __future__ import annotations

import hashlib
import importlib.util
import operator
import re
from collections.abc import Sequence
from fractions import Fraction
from functools import lru_cache
from pathlib import Path
from typing import ClassVar, Protocol

import numpy as np

from ledger.errors import EmbedderError
from ledger.params import NetworkParams

_WORD = re.compile(r"\w+")
#: a float64 squared distance is within ~1e-13 of the exact one; only closer calls need integers
_FLOAT_MARGIN = 1e-9


class Embedder(Protocol):
    """Maps texts to float32 unit vectors of `dim` components; `model_id` names model, backend and precision.

    `directions` gives, per text, a row of integers (int64) pointing exactly where the embedding points,
    computed without rounding, so that validity checks come out the same on every machine.
    """

    model_id: str
    dim: int

    def embed(self, texts: Sequence[str]) -> np.ndarray: ...

    def directions(self, texts: Sequence[str]) -> np.ndarray: ...


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

    def _counts(self, text: str) -> np.ndarray:
        counts = np.zeros(self.dim, dtype=np.int64)
        for feature in self._features(text):
            bucket, sign = _bucket(feature, self.dim)
            counts[bucket] += sign
        return counts

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, text in enumerate(texts):
            counts = self._counts(text)
            norm = np.sqrt(float(np.dot(counts, counts)))
            if norm:
                out[row] = (counts / norm).astype(np.float32)
        return out

    def directions(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.int64)
        for row, text in enumerate(texts):
            out[row] = self._counts(text)
        return out


class WordLlamaEmbedder:
    """WordLlama l2_supercat (256-d static token embeddings) computed with numpy, fully offline.

    A text's vector is the L2-normalised mean of its tokens' rows (no special tokens, no
    truncation): what `wordllama.WordLlamaInference.embed(texts, norm=True)` computes (agrees to
    3e-8). The weights and tokenizer are read from the installed `wordllama` wheel and checked
    against pinned SHA-256 digests, so another release cannot pass for this model. The package
    is located without importing it: its `__init__` calls `logging.basicConfig` and would try to
    download a tokenizer. Each text is embedded alone, so results do not depend on batching.
    """

    model_id = "wordllama-l2supercat-256-numpy"
    dim = 256
    _FILES: ClassVar[dict[tuple[str, str], str]] = {
        ("weights", "l2_supercat_256.safetensors"): "64b47a2dc493cb8e85944076601189739852d7b64e0e1eedcb1937a251cd9fd5",
        ("tokenizers", "l2_supercat_tokenizer_config.json"): (
            "93248f2a9ec36c7b35f700a033d5f36228aae48db61aee31007fa49062cdeb68"
        ),
    }
    _INSTALL: ClassVar[str] = "pip install 'wordllama==0.4.0.post1'"

    def __init__(self) -> None:
        try:
            from safetensors.numpy import load_file
            from tokenizers import Tokenizer
        except ImportError as exc:
            raise self._unavailable(f"{exc.name} is not installed") from None
        spec = importlib.util.find_spec("wordllama")
        if spec is None or not spec.submodule_search_locations:
            raise self._unavailable("the wordllama package is not installed")
        root = Path(next(iter(spec.submodule_search_locations)))
        weights_path, tokenizer_path = (self._pinned(root, parts) for parts in self._FILES)
        self._table16 = load_file(str(weights_path))["embedding.weight"]  # float16, as shipped
        self._table = np.ascontiguousarray(self._table16, dtype=np.float32)
        self._tokenizer = Tokenizer.from_file(str(tokenizer_path))
        self._tokenizer.no_padding()
        self._tokenizer.no_truncation()
        if self._tokenizer.get_vocab_size(with_added_tokens=True) > self._table16.shape[0]:
            raise self._unavailable("its tokenizer has more tokens than its table has rows")

    def _unavailable(self, why: str) -> EmbedderError:
        return EmbedderError("embedder.unavailable", f"model {self.model_id}: {why}; install it with {self._INSTALL}")

    def _pinned(self, root: Path, parts: tuple[str, str]) -> Path:
        path = root.joinpath(*parts)
        if not path.is_file():
            raise self._unavailable(f"{path} is missing")
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        if digest != self._FILES[parts]:
            raise self._unavailable(f"{path} has SHA-256 {digest[:16]}…, not the pinned model file")
        return path

    def _token_ids(self, texts: Sequence[str]) -> list[np.ndarray]:
        """Each text's token ids: rows of the table (`__init__` checked that every id of the tokenizer is one).

        `encode_batch_fast` gives the same ids without tracking character offsets, in ~60% of the time."""
        encodings = self._tokenizer.encode_batch_fast(list(texts), add_special_tokens=False) if texts else []
        return [np.asarray(encoding.ids, dtype=np.intp) for encoding in encodings]

    def directions(self, texts: Sequence[str]) -> np.ndarray:
        """The sum of each text's float16 rows, scaled by 2^24: exact integers (|value| < 2^40 per row).

        Summed in float64, which is exact: every value of this table is a multiple of 2^-24 below 2^4 in
        magnitude, so a partial sum of fewer than 2^25 tokens (a text has at most 4,096 words) is a multiple of
        2^-24 below 2^53 of them. The rows are read from the float32 copy of the table (the same values):
        widening float16 to float64 took half the time of a text's check.
        """
        sums = np.zeros((len(texts), self.dim), dtype=np.float64)
        for row, ids in enumerate(self._token_ids(texts)):
            np.add.reduce(self._table[ids], axis=0, dtype=np.float64, out=sums[row])
        return (sums * (1 << 24)).astype(np.int64)

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, ids in enumerate(self._token_ids(texts)):
            if ids.size:
                total = self._table[ids].sum(axis=0, dtype=np.float32)  # same direction as the mean
                norm = np.float32(np.sqrt(np.dot(total, total)))
                if norm > 0:
                    out[row] = total / norm
        return out


@lru_cache(maxsize=1 << 18)
def _bucket(feature: str, dim: int) -> tuple[int, int]:
    """The bucket and sign of one feature (cached: words and trigrams repeat across texts)."""
    digest = int.from_bytes(hashlib.blake2b(feature.encode(), digest_size=8).digest(), "little")
    return digest % dim, 1 if digest >> 63 else -1


@lru_cache(maxsize=4)
def _wordllama() -> WordLlamaEmbedder:
    """One loaded model per process (30 MB of weights)."""
    return WordLlamaEmbedder()


def embedder_for(params: NetworkParams) -> Embedder:
    """The network's pinned embedder; refuses a model (or dimension) this node cannot load."""
    if params.embedding_model == HashingEmbedder.model_id:
        return HashingEmbedder(params.embedding_dim)
    if params.embedding_model == WordLlamaEmbedder.model_id:
        if params.embedding_dim != WordLlamaEmbedder.dim:
            raise EmbedderError(
                "embedder.unavailable",
                f"model {params.embedding_model} has {WordLlamaEmbedder.dim} dimensions, the network pins "
                f"{params.embedding_dim}",
            )
        return _wordllama()
    raise EmbedderError(
        "embedder.unavailable",
        f"the network pins embedding model {params.embedding_model!r}, which this node cannot load",
    )


def unit(vector: np.ndarray) -> np.ndarray:
    """`vector` scaled to length 1 (the zero vector stays zero)."""
    norm = float(np.linalg.norm(vector))
    return vector / norm if norm else vector


def within_distance(values: bytes, direction: Sequence[int] | np.ndarray, epsilon: Fraction) -> bool:
    """Whether the float16 vector `values` lies within L2 distance `epsilon` of the unit vector along
    `direction`, decided exactly with integers (the same verdict on every machine).

    With c the float16 values scaled by 2^24 (integers), s the direction, e = p/q:
    |c/2^24 - s/|s||² <= e²  <=>  A·|s| <= B  with  A = C2 + 2^48·(1 - e²) > 0,  B = 2^25·(c·s),
    where C2 = |c|²; squared (both sides positive): (q²C2 + 2^48(q²-p²))²·|s|² <= B²·q⁴.
    """
    return within_distances([values], np.asarray([direction], dtype=np.int64), epsilon)[0]


def within_distances(values: Sequence[bytes], directions: np.ndarray, epsilon: Fraction) -> list[bool]:
    """`within_distance` for each vector of `values` and row of `directions` (int64), in one pass.

    float64 decides first when the squared distance is clearly on one side (its error is ~1e-13,
    the margin 1e-9): the integers, ~3x slower, only for a vector within the margin of the bound.
    """
    if not len(values):
        return []
    if any(len(vector) != 2 * directions.shape[1] for vector in values) or len(values) != len(directions):
        raise ValueError(f"{len(values)} vectors and {directions.shape} directions do not pair up")
    vectors = np.frombuffer(b"".join(values), dtype="<f2").astype(np.float64).reshape(len(values), -1)
    along = directions.astype(np.float64)  # exact below 2^53, and only a shortcut: the margin covers the rest
    lengths = np.sqrt(np.einsum("ij,ij->i", along, along))
    pointing = lengths > 0
    along[pointing] /= lengths[pointing, None]
    gaps = np.square(vectors - along).sum(axis=1) - float(epsilon) ** 2
    clear = pointing & (np.abs(gaps) > _FLOAT_MARGIN)
    return [
        bool(gap < 0) if sure else exactly_within_distance(vector, direction.tolist(), epsilon)
        for gap, sure, vector, direction in zip(gaps, clear, values, directions, strict=True)
    ]


def exactly_within_distance(values: bytes, direction: Sequence[int], epsilon: Fraction) -> bool:
    """`within_distance` decided by the integers alone (what the float64 shortcut must agree with)."""
    scaled = (np.frombuffer(values, dtype="<f2").astype(np.float64) * (1 << 24)).astype(np.int64).tolist()
    c2 = sum(x * x for x in scaled)
    s2 = sum(x * x for x in direction)
    p, q = epsilon.numerator, epsilon.denominator
    if s2 == 0:  # no direction at all: only a vector within epsilon of the origin agrees
        return c2 * q * q <= (p * p) << 48
    b = sum(map(operator.mul, scaled, direction)) << 25
    if b <= 0:
        return False
    a = q * q * c2 + ((q * q - p * p) << 48)
    return a * a * s2 <= b * b * q**4


def pack_float16(vector: np.ndarray) -> bytes:
    """float16, little-endian, one byte string: the embedding form inside an operation."""
    return np.asarray(vector, dtype="<f2").tobytes()


def unpack_float16(values: bytes) -> np.ndarray:
    """The float32 vector of a packed float16 embedding."""
    return np.frombuffer(values, dtype="<f2").astype(np.float32)


def unpack_float16_rows(packed: Sequence[bytes]) -> np.ndarray:
    """Packed float16 embeddings of one length (at least one) as float32 rows, converted in one step."""
    return np.frombuffer(b"".join(packed), dtype="<f2").reshape(len(packed), -1).astype(np.float32)
