"""Experiences and the signed operations that create, change and rate them.

An operation is a DAG-CBOR map. Its CID is its identity; an experience's id is the CID of the
operation that created it (an add, or the merge that synthesised it). `parents` are the heads
its author had seen, so operations form a Merkle DAG (as in Merkle-CRDTs).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from ledger import codec
from ledger.cid import CID
from ledger.errors import LedgerError
from ledger.keys import SIGNATURE_LENGTH, AuthorKey

FORMAT_VERSION = 1
#: text key "signature" and a byte-string header for 64 bytes, as DAG-CBOR writes them
_SIGNATURE_ENTRY = b"\x69signature\x58\x40"


class SchemaError(LedgerError):
    """A decoded map that is not an operation: missing, unknown or mistyped fields."""


class Kind(StrEnum):
    ADD = "add"
    MODIFY = "modify"
    DELETE = "delete"
    MERGE = "merge"
    VOTE = "vote"


#: the fields each kind carries besides the common ones
_KIND_FIELDS: dict[Kind, frozenset[str]] = {
    Kind.ADD: frozenset({"content"}),
    Kind.MODIFY: frozenset({"target", "content"}),
    Kind.DELETE: frozenset({"target", "reason"}),
    Kind.MERGE: frozenset({"targets", "content", "reason"}),
    Kind.VOTE: frozenset({"target", "vote"}),
}
_COMMON_FIELDS = frozenset({"version", "kind", "author", "clock", "parents", "created", "signature"})


@dataclass(frozen=True, slots=True)
class Example:
    input: str
    output: str
    correct: bool


@dataclass(frozen=True, slots=True)
class Embedding:
    """A vector as operations carry it: float16 little-endian values packed in one byte string."""

    model: str
    dim: int
    values: bytes = field(repr=False)


@dataclass(frozen=True, slots=True)
class Experience:
    """The content of an experience; author and creation time live on the operation."""

    text: str
    domain: tuple[str, ...]
    confidence: float
    embedding: Embedding
    examples: tuple[Example, ...] = ()
    source: str = ""


@dataclass(frozen=True, slots=True)
class Operation:
    """One signed change to the library; fields that a kind does not use stay None/empty."""

    kind: Kind
    author: str
    clock: int
    parents: tuple[CID, ...]
    created: int
    content: Experience | None = None
    target: CID | None = None
    targets: tuple[CID, ...] = ()
    reason: str | None = None
    vote: int | None = None
    signature: bytes = field(default=b"", repr=False)

    def record(self, signed: bool = True) -> dict[str, Any]:
        """The DAG-CBOR map of this operation (without `signature` when `signed` is False)."""
        rec: dict[str, Any] = {
            "version": FORMAT_VERSION,
            "kind": self.kind.value,
            "author": self.author,
            "clock": self.clock,
            "parents": list(self.parents),
            "created": self.created,
        }
        wanted = _KIND_FIELDS[self.kind]
        if "content" in wanted and self.content is not None:
            rec["content"] = _experience_record(self.content)
        if "target" in wanted:
            rec["target"] = self.target
        if "targets" in wanted:
            rec["targets"] = list(self.targets)
        if "reason" in wanted:
            rec["reason"] = self.reason
        if "vote" in wanted:
            rec["vote"] = self.vote
        if signed:
            rec["signature"] = self.signature
        return rec

    @property
    def dependencies(self) -> tuple[CID, ...]:
        """Parents and targets, each once: what must be applied before this operation applies."""
        targets = self.targets if self.target is None else (self.target, *self.targets)
        return tuple(dict.fromkeys(self.parents + targets))

    def signing_bytes(self) -> bytes:
        """What the signature covers: the canonical encoding without the signature field."""
        return codec.encode(self.record(signed=False))


@dataclass(frozen=True, slots=True)
class Block:
    """An operation together with its canonical bytes and CID."""

    op: Operation
    data: bytes = field(repr=False)
    cid: CID

    def signing_bytes(self) -> bytes:
        """`op.signing_bytes()` without re-encoding, valid because `data` is canonical.

        "signature" is the longest key of an operation, so DAG-CBOR order puts its entry last
        (76 bytes: key, 2-byte header, 64-byte value); dropping it and decrementing the one-byte
        map header gives the unsigned encoding. A signature of another length takes the slow path.
        """
        if len(self.op.signature) != SIGNATURE_LENGTH or not self.data.endswith(_SIGNATURE_ENTRY + self.op.signature):
            return self.op.signing_bytes()
        return bytes([self.data[0] - 1]) + self.data[1 : -len(_SIGNATURE_ENTRY) - SIGNATURE_LENGTH]


def _experience_record(exp: Experience) -> dict[str, Any]:
    return {
        "text": exp.text,
        "domain": list(exp.domain),
        "confidence": exp.confidence,
        "examples": [{"input": ex.input, "output": ex.output, "correct": ex.correct} for ex in exp.examples],
        "embedding": {"model": exp.embedding.model, "dim": exp.embedding.dim, "values": exp.embedding.values},
        "source": exp.source,
    }


def sign(op: Operation, key: AuthorKey) -> Block:
    """Sign `op` as `key`'s author and encode it; the author field is set from the key."""
    unsigned = replace(op, author=key.did, signature=b"")
    signed = replace(unsigned, signature=key.sign(unsigned.signing_bytes()))
    data = codec.encode(signed.record())
    return Block(signed, data, CID.for_block(data))


def decode_block(data: bytes) -> Block:
    """Bytes → Block. Raises codec.DecodeError for non-canonical bytes, SchemaError for a wrong shape.

    This checks form only; `validation` checks the rules and the signature.
    """
    return Block(operation_from_record(codec.decode(data)), data, CID.for_block(data))


def load_stored(data: bytes) -> Operation:
    """An operation from this node's own store: validated when it was accepted, so no canonical check."""
    return operation_from_record(codec.unpack(data))


# --- schema: decoded map → Operation, with the failing field named -------------------------


def _require(rec: dict[str, Any], name: str, kind: type | tuple[type, ...], path: str) -> Any:
    if name not in rec:
        raise SchemaError("schema.missing", f"{path}{name}: required field is missing")
    value = rec[name]
    if type(value) not in (kind if isinstance(kind, tuple) else (kind,)):
        wanted = " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
        raise SchemaError("schema.type", f"{path}{name}: expected {wanted}, got {type(value).__name__}")
    return value


def _only(rec: dict[str, Any], allowed: frozenset[str], path: str) -> None:
    extra = rec.keys() - allowed
    if extra:
        raise SchemaError("schema.unknown_field", f"{path}{sorted(extra)[0][:100]}: unknown field")


def _list_of(values: list[Any], kind: type, path: str) -> tuple[Any, ...]:
    for index, value in enumerate(values):
        if type(value) is not kind:
            raise SchemaError("schema.type", f"{path}[{index}]: expected {kind.__name__}, got {type(value).__name__}")
    return tuple(values)


def _experience_from_record(rec: dict[str, Any]) -> Experience:
    path = "content."
    _only(rec, frozenset({"text", "domain", "confidence", "examples", "embedding", "source"}), path)
    examples = []
    for index, item in enumerate(_require(rec, "examples", list, path)):
        where = f"{path}examples[{index}]."
        if type(item) is not dict:
            raise SchemaError("schema.type", f"{where[:-1]}: expected map, got {type(item).__name__}")
        _only(item, frozenset({"input", "output", "correct"}), where)
        examples.append(
            Example(
                _require(item, "input", str, where),
                _require(item, "output", str, where),
                _require(item, "correct", bool, where),
            )
        )
    emb = _require(rec, "embedding", dict, path)
    where = f"{path}embedding."
    _only(emb, frozenset({"model", "dim", "values"}), where)
    return Experience(
        text=_require(rec, "text", str, path),
        domain=_list_of(_require(rec, "domain", list, path), str, f"{path}domain"),
        confidence=_require(rec, "confidence", float, path),
        embedding=Embedding(
            _require(emb, "model", str, where), _require(emb, "dim", int, where), _require(emb, "values", bytes, where)
        ),
        examples=tuple(examples),
        source=_require(rec, "source", str, path),
    )


def operation_from_record(rec: Any) -> Operation:
    """A decoded DAG-CBOR value → Operation, or SchemaError naming the first bad field."""
    if type(rec) is not dict:
        raise SchemaError("schema.type", f"operation: expected map, got {type(rec).__name__}")
    version = _require(rec, "version", int, "")
    if version != FORMAT_VERSION:
        raise SchemaError("schema.version", f"version: {version} is not supported (expected {FORMAT_VERSION})")
    kind_name = _require(rec, "kind", str, "")
    try:
        kind = Kind(kind_name)
    except ValueError:
        raise SchemaError("schema.kind", f"kind: {kind_name!r} is not one of {', '.join(Kind)}") from None
    wanted = _KIND_FIELDS[kind]
    _only(rec, _COMMON_FIELDS | wanted, "")
    return Operation(
        kind=kind,
        author=_require(rec, "author", str, ""),
        clock=_require(rec, "clock", int, ""),
        parents=_list_of(_require(rec, "parents", list, ""), CID, "parents"),
        created=_require(rec, "created", int, ""),
        content=_experience_from_record(_require(rec, "content", dict, "")) if "content" in wanted else None,
        target=_require(rec, "target", CID, "") if "target" in wanted else None,
        targets=_list_of(_require(rec, "targets", list, ""), CID, "targets") if "targets" in wanted else (),
        reason=_require(rec, "reason", str, "") if "reason" in wanted else None,
        vote=_require(rec, "vote", int, "") if "vote" in wanted else None,
        signature=_require(rec, "signature", bytes, ""),
    )
