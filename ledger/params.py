"""Network parameters: the rules every node of one network must share for ops to be valid everywhere."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ledger.errors import LedgerError

TextUnit = Literal["words", "tokens"]


class ParamsError(LedgerError):
    """A network parameter file that is unreadable or holds a bad value."""


@dataclass(frozen=True, slots=True)
class NetworkParams:
    """Limits and pinned models; defaults follow the first format seed (32 words)."""

    #: "words" counts whitespace-separated words (seed 1: 32 words); "tokens" counts the
    #: deterministic tokens of `validation.count_tokens` (seed 2: 256 tokens)
    text_unit: TextUnit = "words"
    text_max: int = 32
    embedding_model: str = "feature-hash-v1"
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
    near_duplicate_cosine: float = 0.9
    #: retrieval serves experiences whose cosine with the query exceeds this (per model: calibrated)
    relevance_threshold: float = 0.3
    #: an operation's embedding must lie within this L2 distance of the node's own embedding of its text
    embedding_epsilon: float = 0.01

    @classmethod
    def from_file(cls, path: Path) -> NetworkParams:
        """Load a JSON parameter file; unknown keys and wrong types are errors, missing keys take defaults."""
        try:
            raw = json.loads(Path(path).read_text())
        except (OSError, ValueError) as exc:
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
