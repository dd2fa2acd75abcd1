"""Deterministic operations for tests and fixtures: fixed keys, fixed times, the hashing embedder."""

from __future__ import annotations

from dataclasses import replace
from functools import cache

from ledger.cid import CID
from ledger.embedder import HashingEmbedder, pack_float16
from ledger.keys import AuthorKey
from ledger.ops import Block, Embedding, Example, Experience, Kind, Operation, sign
from ledger.params import NetworkParams

PARAMS = NetworkParams(embedding_model="feature-hash-v1")  # the deterministic test embedder
EMBEDDER = HashingEmbedder(PARAMS.embedding_dim)
CREATED = 1_726_410_600  # 2024-09-15T14:30:00Z

#: the four example experiences of the first format seed
SEED_TEXTS = (
    "When solving geometry problems with intersections, validate solutions lie within bounded regions "
    "or segments, not on extensions, to avoid extraneous answers.",
    "For expected extreme statistics in combinatorial problems, use direct enumeration for small sizes.",
    "When using mathematical invariants to prove impossibility, always validate them against known "
    "achievable states or small cases.",
    "For complex polynomials with real parameters, separate real and imaginary parts to find when real roots exist.",
)


@cache  # making a key and its did:key costs ~0.3 ms, and the property tests sign thousands of operations
def author(number: int) -> AuthorKey:
    return AuthorKey(bytes([number]) * 32)


def embedding(text: str) -> Embedding:
    return Embedding(EMBEDDER.model_id, EMBEDDER.dim, pack_float16(EMBEDDER.embed([text])[0]))


def content(
    text: str = SEED_TEXTS[0],
    domain: tuple[str, ...] = ("math", "geometry"),
    confidence: float = 0.87,
    examples: tuple[Example, ...] = (),
    source: str = "",
) -> Experience:
    return Experience(text, domain, confidence, embedding(text), examples, source)


def operation(kind: Kind, clock: int = 1, parents: tuple[CID, ...] = (), **fields: object) -> Operation:
    return Operation(kind=kind, author="", clock=clock, parents=tuple(sorted(parents)), created=CREATED, **fields)


def signed(op: Operation, key: AuthorKey | None = None) -> Block:
    return sign(op, key or author(1))


def add(text: str = SEED_TEXTS[0], key: AuthorKey | None = None, **content_fields: object) -> Block:
    return signed(operation(Kind.ADD, content=content(text, **content_fields)), key)


def with_fields(block: Block, key: AuthorKey | None = None, **changes: object) -> Block:
    """Re-sign `block`'s operation with some fields changed (to build deliberately broken operations)."""
    return signed(replace(block.op, **changes), key)
