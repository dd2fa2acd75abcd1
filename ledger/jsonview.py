"""The JSON view of the first format seed: how people and the RPC see experiences and operations."""

from __future__ import annotations

import json
import math
import re
from datetime import UTC, datetime
from typing import Any

from ledger.cid import CID
from ledger.embedder import Embedder, pack_float16, unpack_float16
from ledger.errors import LedgerError
from ledger.ops import FORMAT_VERSION, Block, Embedding, Example, Experience, Operation

#: fields of the view that the ledger derives; accepted on input (so a view round-trips) and ignored
_DERIVED = frozenset({"id", "version", "embedding", "merkle_proof"})
_DERIVED_METADATA = frozenset({"created_at", "created_by", "votes", "usage_count", "domains_applied"})
_USER = frozenset({"text", "domain", "confidence", "examples", "metadata"})
#: UTF-16 surrogate code points: a JSON escape such as "\ud800" can produce one alone, and it is not text
_SURROGATE = re.compile("[\ud800-\udfff]")


class JsonViewError(LedgerError):
    """A JSON experience that cannot become an operation's content."""


_LAST_ISO_SECOND = 253402300799  # 9999-12-31T23:59:59Z


def iso8601(seconds: int) -> str | None:
    """ISO-8601 UTC, or None for a time outside years 1970-9999 (valid operations may carry one)."""
    if not 0 <= seconds <= _LAST_ISO_SECOND:
        return None
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _embedding_json(emb: Embedding) -> dict[str, Any]:
    return {"model": emb.model, "dim": emb.dim, "values": [float(v) for v in unpack_float16(emb.values)]}


def experience_json(
    experience_id: CID,
    op: Operation,
    *,
    upvotes: int = 0,
    downvotes: int = 0,
    usage_count: int = 0,
    domains_applied: tuple[str, ...] = (),
    merkle_proof: Any = None,
) -> dict[str, Any]:
    """The seed's experience object for the version of `experience_id` that `op` carries."""
    content = op.content
    if content is None:
        raise ValueError(f"a {op.kind} operation carries no experience")
    return {
        "id": str(experience_id),
        "version": f"{FORMAT_VERSION}.0",
        "domain": ".".join(content.domain),
        "text": content.text,
        "confidence": content.confidence,
        "examples": [{"input": ex.input, "output": ex.output, "correct": ex.correct} for ex in content.examples],
        "metadata": {
            "created_at": iso8601(op.created),
            "created_by": op.author,
            "source": content.source,
            "votes": {"upvotes": upvotes, "downvotes": downvotes},
            "usage_count": usage_count,
            "domains_applied": list(domains_applied),
        },
        "embedding": _embedding_json(content.embedding),
        "merkle_proof": merkle_proof,
    }


def operation_json(block: Block) -> dict[str, Any]:
    """Every field of an operation, for `op inspect` and the RPC."""
    op = block.op
    view: dict[str, Any] = {
        "cid": str(block.cid),
        "kind": op.kind.value,
        "author": op.author,
        "clock": op.clock,
        "parents": [str(parent) for parent in op.parents],
        "created": op.created,
        "created_at": iso8601(op.created),
    }
    if op.content is not None:
        content = op.content
        view["content"] = {
            "text": content.text,
            "domain": ".".join(content.domain),
            "confidence": content.confidence,
            "examples": [{"input": ex.input, "output": ex.output, "correct": ex.correct} for ex in content.examples],
            "source": content.source,
            "embedding": _embedding_json(content.embedding),
        }
    if op.target is not None:
        view["target"] = str(op.target)
    if op.targets:
        view["targets"] = [str(target) for target in op.targets]
    if op.reason is not None:
        view["reason"] = op.reason
    if op.vote is not None:
        view["vote"] = op.vote
    view["signature"] = op.signature.hex()
    return view


def loads(text: str | bytes, where: str) -> Any:
    """Parse JSON for a view, refusing a repeated key (which value would count is a guess; Python keeps the last).

    `where` names the input (a flag and file) in the error.
    """
    try:
        return json.loads(text, object_pairs_hook=_unique_keys)
    except JsonViewError as exc:
        raise JsonViewError(exc.code, f"{where}: {exc.message}") from None
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError too
        raise JsonViewError("json.syntax", f"{where}: not JSON ({type(exc).__name__}: {exc})") from None


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for key, value in pairs:
        if key in found:
            raise JsonViewError("json.duplicate_key", f"key {key[:60]!r} appears twice in one object")
        found[key] = value
    return found


def _text(value: str, where: str) -> str:
    """`value` if it is Unicode text; a lone surrogate cannot be stored, signed or embedded."""
    surrogate = _SURROGATE.search(value)
    if surrogate:
        raise JsonViewError(
            "json.utf8",
            f"{where}: holds a lone surrogate U+{ord(surrogate.group()):04X} at character {surrogate.start()}, "
            "which is not Unicode text",
        )
    return value


def _field(obj: dict[str, Any], name: str, kind: type | tuple[type, ...], path: str = "") -> Any:
    if name not in obj:
        raise JsonViewError("json.missing", f"{path}{name}: required field is missing")
    value = obj[name]
    if not isinstance(value, kind) or (
        isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,))
    ):
        raise JsonViewError("json.type", f"{path}{name}: has the wrong type ({type(value).__name__})")
    return _text(value, f"{path}{name}") if isinstance(value, str) else value


def _unknown(obj: dict[str, Any], allowed: frozenset[str], path: str) -> None:
    extra = sorted(obj.keys() - allowed)
    if extra:
        raise JsonViewError("json.unknown_field", f"{path}{extra[0][:100]}: unknown field")


def experience_from_json(obj: Any, embedder: Embedder) -> Experience:
    """The user-supplied fields of a view → content, embedded with the network's embedder.

    `domain` may be a dotted string or a list of labels; derived fields (id, votes, …) are ignored.
    """
    if not isinstance(obj, dict):
        raise JsonViewError("json.type", "experience: expected a JSON object")
    _unknown(obj, _USER | _DERIVED, "")
    text = _field(obj, "text", str)
    domain_value = _field(obj, "domain", (str, list))
    domain = tuple(domain_value.split(".")) if isinstance(domain_value, str) else tuple(domain_value)
    if not all(isinstance(label, str) for label in domain):
        raise JsonViewError("json.type", "domain: labels must be strings")
    for index, label in enumerate(domain_value if isinstance(domain_value, list) else ()):
        _text(label, f"domain[{index}]")
    try:
        confidence = float(_field(obj, "confidence", (int, float))) + 0.0  # + 0.0: a JSON -0.0 is 0
    except OverflowError:
        confidence = math.inf
    if not math.isfinite(confidence):
        raise JsonViewError("json.type", "confidence: must be a finite number")
    examples = []
    if not isinstance(obj.get("examples", []), list):
        raise JsonViewError("json.type", "examples: expected a list")
    for index, item in enumerate(obj.get("examples", [])):
        where = f"examples[{index}]."
        if not isinstance(item, dict):
            raise JsonViewError("json.type", f"{where[:-1]}: expected a JSON object")
        _unknown(item, frozenset({"input", "output", "correct"}), where)
        examples.append(
            Example(
                _field(item, "input", str, where),
                _field(item, "output", str, where),
                _field(item, "correct", bool, where),
            )
        )
    metadata = obj.get("metadata", {})
    if not isinstance(metadata, dict):
        raise JsonViewError("json.type", "metadata: expected a JSON object")
    _unknown(metadata, _DERIVED_METADATA | {"source"}, "metadata.")
    source = _field(metadata, "source", str, "metadata.") if "source" in metadata else ""
    vector = embedder.embed([text])[0]
    return Experience(
        text=text,
        domain=domain,
        confidence=confidence,
        embedding=Embedding(embedder.model_id, embedder.dim, pack_float16(vector)),
        examples=tuple(examples),
        source=source,
    )
