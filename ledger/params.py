"""Network parameters: the rules every node of one network must share for ops to be valid everywhere."""

from __future__ import annotations

import dataclasses
import json
import re
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

#: the allowed range of every integer parameter (inclusive). A file from anywhere can set them, so
#: each is bounded where it would start to cost memory or break storage: an embedding is allocated
#: per text (8,192 dimensions covers the seeds' 7,680-d model), an operation is read whole (1 MiB),
#: and parents and merge targets are counted in one byte beside each stored operation (255). A
#: limit on characters never needs to exceed the largest operation. The causal horizon bounds an
#: ancestry walk (§7.2 of docs/PROTOCOL.md) to that many clock levels, and the absorption horizon
#: how far apart in clocks an add and its near-duplicate may lie (§7.6); 2**32 is far beyond any
#: network's history, so neither needs more.
INT_RANGES: dict[str, tuple[int, int]] = {
    "text_max": (1, 4096),
    "embedding_dim": (1, 8192),
    "max_op_bytes": (256, 1 << 20),
    "max_examples": (1, 64),
    "max_example_chars": (1, 1 << 20),
    "max_reason_chars": (1, 1 << 20),
    "max_source_chars": (1, 1 << 20),
    "max_parents": (1, 255),
    "max_merge_targets": (2, 255),
    "max_domain_depth": (1, 64),
    "causal_horizon": (1, 1 << 32),
    "absorption_horizon": (1, 1 << 32),
}
_MODEL_NAME = re.compile(r"[\x21-\x7e]{1,128}")  # printable ASCII without spaces: it is written into every operation
#: a network's name: it names the gossip topic and is recorded in every data directory of the network
_NETWORK_ID = re.compile(r"[a-z0-9][a-z0-9._-]{0,62}")
#: a parameter file is a few hundred bytes; reading more is refused
MAX_FILE_BYTES = 64 * 1024


class ParamsError(LedgerError):
    """A network parameter file that is unreadable or holds a bad value."""


@dataclass(frozen=True, slots=True)
class NetworkParams:
    """Limits and pinned models; defaults follow the first format seed (32 words)."""

    #: the network's name: nodes of networks with other names never exchange operations
    network_id: str = "devnet"
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
    #: an operation whose clock exceeds another's by more than this counts as its descendant (§7.2), so
    #: deciding ancestry walks at most this many clock levels
    causal_horizon: int = 1024
    #: an add is absorbed only into a near-duplicate at most this many clocks below it (§7.6): what one late
    #: add can take over is then the adds of a window of clocks, not every copy of an insight since it began.
    #: Copies that keep coming join through chains of F, one link per window: a larger horizon makes a late
    #: copy take over more, a smaller one the chains longer (1M workload: at most 90 copies in a window of
    #: 4,096 clocks and chains of at most 75 links; 33 and 313 at 1,024)
    absorption_horizon: int = 4096
    #: two live experiences whose embeddings have a cosine above this are near-duplicates (Add + Add merge)
    near_duplicate_cosine: float = None  # type: ignore[assignment]  # None: the model's calibrated value
    #: retrieval serves experiences whose cosine with the query exceeds this
    relevance_threshold: float = None  # type: ignore[assignment]
    #: an operation's embedding must lie within this L2 distance of the node's own embedding of its text
    embedding_epsilon: float = None  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if not isinstance(self.network_id, str) or not _NETWORK_ID.fullmatch(self.network_id):
            raise ParamsError(
                "params.range",
                f"network_id: {str(self.network_id)[:40]!r} must be 1 to 63 of a-z 0-9 . _ -, starting with a "
                "letter or digit",
            )
        if not _MODEL_NAME.fullmatch(self.embedding_model):
            raise ParamsError(
                "params.range",
                f"embedding_model: {self.embedding_model[:40]!r} must be 1 to 128 printable ASCII characters "
                "without spaces",
            )
        calibrated = CALIBRATED.get(self.embedding_model, {})
        for name in _CALIBRATED_FIELDS:
            if getattr(self, name) is None:
                if name not in calibrated:
                    raise ParamsError(
                        "params.missing", f"{name}: no calibrated default for model {self.embedding_model!r}; set it"
                    )
                object.__setattr__(self, name, calibrated[name])
        self._check_ranges()

    def _check_ranges(self) -> None:
        """Every other parameter within its bounds, so no file can make a node allocate or accept without limit."""
        if self.text_unit not in ("words", "tokens"):
            raise ParamsError("params.range", f"text_unit: {self.text_unit!r} is not 'words' or 'tokens'")
        for name, (low, high) in INT_RANGES.items():
            value = getattr(self, name)
            if not low <= value <= high:
                raise ParamsError("params.range", f"{name}: {value} is outside the allowed range {low}..{high}")
        for name in _CALIBRATED_FIELDS:
            value = getattr(self, name)
            if not 0.0 < value < 1.0:  # also refuses NaN
                raise ParamsError("params.range", f"{name}: {value} is outside the allowed range (0, 1)")

    @classmethod
    def from_file(cls, path: Path) -> NetworkParams:
        """Load a JSON parameter file; unknown keys and wrong types are errors, missing keys take defaults."""
        try:
            with open(path, "rb") as handle:
                data = handle.read(MAX_FILE_BYTES + 1)
        except OSError as exc:
            raise ParamsError("params.file", f"{path}: cannot read network parameters ({exc.strerror})") from None
        if len(data) > MAX_FILE_BYTES:
            raise ParamsError("params.file", f"{path}: larger than {MAX_FILE_BYTES} bytes; not a parameter file")
        try:
            raw = json.loads(data.decode("utf-8"), object_pairs_hook=_unique_keys)
        except (ValueError, RecursionError) as exc:
            raise ParamsError("params.file", f"{path}: cannot read network parameters ({exc})") from None
        except ParamsError as exc:
            raise ParamsError(exc.code, f"{path}: {exc.message}") from None
        return cls.from_mapping(raw, source=str(path))

    @classmethod
    def from_mapping(cls, raw: object, source: str = "params") -> NetworkParams:
        if not isinstance(raw, dict):
            raise ParamsError("params.type", f"{source}: expected a JSON object")
        fields = {field.name: field for field in dataclasses.fields(cls)}
        for name, value in raw.items():
            if name not in fields:
                raise ParamsError("params.unknown", f"{source}: unknown parameter {name!r}")
            expected = {
                "network_id": str,
                "text_unit": str,
                "embedding_model": str,
                **dict.fromkeys(_CALIBRATED_FIELDS, float),
            }.get(name, int)
            if type(value) is not expected:
                raise ParamsError("params.type", f"{source}: {name} must be {expected.__name__}")
        try:
            return cls(**raw)
        except ParamsError as exc:
            raise ParamsError(exc.code, f"{source}: {exc.message}") from None

    def to_json(self) -> str:
        """The parameter file of this network (every value explicit), as `from_file` reads it."""
        return json.dumps(dataclasses.asdict(self), indent=2) + "\n"


def _unique_keys(pairs: list[tuple[str, object]]) -> dict[str, object]:
    """A JSON object whose keys are unique: with a repeated key, which value counts would be a guess."""
    found: dict[str, object] = {}
    for key, value in pairs:
        if key in found:
            raise ParamsError("params.duplicate", f"parameter {key!r} appears twice")
        found[key] = value
    return found
