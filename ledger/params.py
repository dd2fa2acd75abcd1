"""Network parameters: the rules every node of one network must share for ops to be valid everywhere."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ledger.errors import LedgerError

TextUnit = Literal["words", "tokens"]

#: per-model defaults, each measured with bench/quality.py (figures in the README): the retrieval
#: floor (best F1 on query -> experience pairs), the near-duplicate cosine (above every
#: sentence/negation pair, below trivial rewordings), and the embedding-consistency epsilon (L2;
#: float16 packing errs by at most ~5e-4)
CALIBRATED: dict[str, dict[str, float]] = {
    "wordllama-l2supercat-256-numpy": {
        "relevance_threshold": 0.30,
        "near_duplicate_cosine": 0.99,
        "embedding_epsilon": 2e-3,
    },
    "feature-hash-v1": {
        "relevance_threshold": 0.28,
        "near_duplicate_cosine": 0.9,
        "embedding_epsilon": 2e-3,
    },
}
_CALIBRATED_FIELDS = ("relevance_threshold", "near_duplicate_cosine", "embedding_epsilon")


class ParamsError(LedgerError):
    """A network parameter file that is unreadable or holds a bad value."""


@dataclass(frozen=True, slots=True)
class NetworkParams:
    """Limits and pinned models; defaults follow the first format seed (32 words)."""

    #: "words" counts whitespace-separated words (seed 1: 32 words); "tokens" counts the
    #: deterministic tokens of `validation.count_tokens` (seed 2: 256 tokens)
    text_unit: TextUnit = "words"
    text_max: int = 32
    embedding_model: str = "wordllama-l2supercat-256-numpy"
    embedding_dim: int = 256
    max_op_bytes: int = 64 * 1024
    max_examples: int = 8
    max_example_chars: int = 2000
    max_reason_chars: int = 500
    max_source_chars: int = 200
    max_parents: int = 64
    max_merge_targets: int = 16
    max_domain_depth: int = 8
    #: two live experiences whose embeddings have a cosine above this are near-duplicates (Add + Add merge)
    near_duplicate_cosine: float = None  # type: ignore[assignment]  # None: the model's calibrated value
    #: retrieval serves experiences whose cosine with the query exceeds this
    relevance_threshold: float = None  # type: ignore[assignment]
    #: an operation's embedding must lie within this L2 distance of the node's own embedding of its text
    embedding_epsilon: float = None  # type: ignore[assignment]

    def __post_init__(self) -> None:
        calibrated = CALIBRATED.get(self.embedding_model, {})
        for name in ("max_parents", "max_merge_targets"):
            if not 0 < getattr(self, name) <= 255:  # stored as one byte beside each operation
                raise ParamsError("params.range", f"{name}: must be between 1 and 255")
        for name in _CALIBRATED_FIELDS:
            if getattr(self, name) is None:
                if name not in calibrated:
                    raise ParamsError(
                        "params.missing", f"{name}: no calibrated default for model {self.embedding_model!r}; set it"
                    )
                object.__setattr__(self, name, calibrated[name])

    @classmethod
    def from_file(cls, path: Path) -> NetworkParams:
        """Load a JSON parameter file; unknown keys and wrong types are errors, missing keys take defaults."""
        try:
            raw = json.loads(Path(path).read_text())
        except (OSError, ValueError, RecursionError) as exc:
            raise ParamsError("params.file", f"{path}: cannot read network parameters ({exc})") from None
        return cls.from_mapping(raw, source=str(path))

    @classmethod
    def from_mapping(cls, raw: object, source: str = "params") -> NetworkParams:
        if not isinstance(raw, dict):
            raise ParamsError("params.type", f"{source}: expected a JSON object")
        fields = {field.name: field for field in dataclasses.fields(cls)}
        for name, value in raw.items():
            if name not in fields:
                raise ParamsError("params.unknown", f"{source}: unknown parameter {name!r}")
            floats = ("near_duplicate_cosine", "relevance_threshold", "embedding_epsilon")
            expected = {"text_unit": str, "embedding_model": str, **dict.fromkeys(floats, float)}.get(name, int)
            if type(value) is not expected:
                raise ParamsError("params.type", f"{source}: {name} must be {expected.__name__}")
            if expected is int and value <= 0:
                raise ParamsError("params.range", f"{source}: {name} must be positive, got {value}")
        for name in ("near_duplicate_cosine", "relevance_threshold", "embedding_epsilon"):
            if name in raw and not 0.0 < raw[name] < 1.0:
                raise ParamsError("params.range", f"{source}: {name} must be in (0, 1)")
        if raw.get("text_unit", "words") not in ("words", "tokens"):
            raise ParamsError("params.range", f"{source}: text_unit must be 'words' or 'tokens'")
        return cls(**raw)
