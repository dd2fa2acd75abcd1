"""Stateless validation: everything a node can check about one operation without its library.

Every failure is a ValidationError with a stable dotted code and a message naming the field.
Redundancy is deliberately NOT checked here: it depends on local state (the merge rules decide).
"""

from __future__ import annotations

import re
import threading
import unicodedata
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from fractions import Fraction

import numpy as np

from ledger.cid import CID
from ledger.embedder import Embedder, unit, unpack_float16, within_distances
from ledger.errors import LedgerError
from ledger.keys import SIGNATURE_LENGTH, IdentityError, public_key_from_did, verify_signature
from ledger.ops import Block, Experience, Kind, Operation, decode_block
from ledger.params import NetworkParams
from ledger.priority import NEVER

_INT63_MAX = 2**63 - 1
_DOMAIN_LABEL = re.compile(r"[a-z][a-z0-9_-]{0,31}")
_TOKEN = re.compile(r"\w+|[^\w\s]")
#: Unicode category Cc: C0 controls, DEL and C1 controls
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")

# Characters are judged by the Unicode Character Database 3.2.0, frozen inside every Python
# (`unicodedata.ucd_3_2_0`, the table of IDNA2003), never by the interpreter's own Unicode version:
# a node on a newer Python must reach the same verdict (docs/PROTOCOL.md §6.2).
_UCD = unicodedata.ucd_3_2_0
#: unassigned, format (bidi overrides, zero-width), private use, surrogates, line/paragraph separators
_REFUSED_CATEGORIES = frozenset({"Cn", "Cf", "Co", "Cs", "Zl", "Zp"})
#: Default_Ignorable_Code_Point characters that UCD 3.2 files under a visible category (invisible when
#: rendered: soft hyphen, combining grapheme joiner, fillers, variation selectors, ...)
_IGNORABLE = re.compile(
    "[\u00ad\u034f\u061c\u115f\u1160\u17b4\u17b5\u180b-\u180f\u200b-\u200f\u202a-\u202e"
    "\u2060-\u206f\u3164\ufe00-\ufe0f\ufeff\uffa0\ufff0-\ufff8]"
)

# Structure (format seed 1): "When [context], [action]" (also "For …, …", "If …, …"),
# or "[precondition] implies [strategy]".
_CONTEXT_CLAUSE = re.compile(r"(?:when|for|if)\s+\w[^,]*,\s*\w", re.IGNORECASE)
_IMPLICATION = re.compile(r"\w.*?\simplies\s+\w", re.IGNORECASE | re.DOTALL)  # linear: one \s before it

# Generality (format seed 1: "no problem-specific constants"). A heuristic, documented in
# docs/PROTOCOL.md: an experience states a strategy, so it holds no equations, no algebra and no
# concrete numbers. Single digits stay allowed ("2 cases", "3D geometry").
_EQUATION = re.compile(r"[\w)\]]\s*(?:==|=|≠|≤|≥|<|>)\s*[-\w(\[]")
_EXPRESSION = re.compile(r"\w\s*\^\s*[-\w(]|\d\s*[-+*/\u00d7\u00f7]\s*\d|\b\d+[a-z]\b")
_NUMBER = re.compile(r"(?<![\w.])\d+(?:[.,/:]\d+)*")
_COORDINATES = re.compile(r"\(\s*-?\d+(?:\.\d+)?\s*[,;]\s*-?\d")
#: a cheap pre-filter: text without any of these characters passes all three generality rules
_GENERALITY_HINT = re.compile(r"[\d=<>≠≤≥^]")


class ValidationError(LedgerError):
    """One broken rule of one operation."""


def count_tokens(text: str) -> int:
    """The deterministic token count used when a network limits text in tokens: words and punctuation marks."""
    return len(_TOKEN.findall(text))


def text_length(text: str, params: NetworkParams) -> int:
    return len(text.split()) if params.text_unit == "words" else count_tokens(text)


def check_text(text: str, params: NetworkParams, path: str = "content.text") -> list[ValidationError]:
    """Length, structure and generality of an experience's text."""
    errors = []
    if not text.strip():
        return [ValidationError("text.empty", f"{path}: is empty")]
    if _CONTROL.search(text):
        errors.append(ValidationError("text.control", f"{path}: holds control characters (newlines, tabs, …)"))
    if not text.isascii():
        errors.extend(_check_characters(text, path))
    length = text_length(text, params)
    if length > params.text_max:
        errors.append(
            ValidationError("text.length", f"{path}: {length} {params.text_unit}, the network allows {params.text_max}")
        )
    stripped = text.strip()
    if not (_CONTEXT_CLAUSE.match(stripped) or _IMPLICATION.match(stripped)):
        errors.append(
            ValidationError(
                "text.structure",
                f"{path}: must open with a context clause ('When …, …', 'For …, …', 'If …, …') "
                "or have the form '… implies …'",
            )
        )
    if not _GENERALITY_HINT.search(text):
        return errors
    numbers = (found for found in _NUMBER.finditer(text) if len(found.group()) > 1)
    for code, found, what in (
        ("text.generality.equation", _EQUATION.search(text), "an equation or inequality"),
        ("text.generality.expression", _EXPRESSION.search(text), "an algebraic expression"),
        ("text.generality.number", next(numbers, None) or _COORDINATES.search(text), "a concrete number"),
    ):
        if found:  # quoted cut: a number can be thousands of digits long
            message = f"{path}: holds {what} ({found.group()[:40]!r}); state the strategy, not the problem"
            errors.append(ValidationError(code, message))
    return errors


def _check_characters(text: str, path: str) -> list[ValidationError]:
    """Non-ASCII text must be visible and in one canonical form, so a copy cannot hide from the
    near-duplicate rule or reorder what a reader sees (§6.2)."""
    for position, char in enumerate(text):
        category = _UCD.category(char)
        if category in _REFUSED_CATEGORIES or (category == "Zs" and char != " ") or _IGNORABLE.match(char):
            return [
                ValidationError(
                    "text.character",
                    f"{path}: character {position} is U+{ord(char):04X} ({category}, invisible, unassigned or "
                    "a non-ASCII space); only visible characters and the ASCII space are allowed",
                )
            ]
    if _UCD.normalize("NFC", text) != text:
        return [ValidationError("text.normalization", f"{path}: is not in Unicode normalization form NFC")]
    return []


def _check_experience(exp: Experience, params: NetworkParams) -> list[ValidationError]:
    errors = check_text(exp.text, params)
    if not 0.0 <= exp.confidence <= 1.0:
        errors.append(ValidationError("confidence.range", f"content.confidence: {exp.confidence} is outside [0, 1]"))
    if not 1 <= len(exp.domain) <= params.max_domain_depth:
        errors.append(
            ValidationError(
                "domain.depth", f"content.domain: {len(exp.domain)} labels, expected 1 to {params.max_domain_depth}"
            )
        )
    for index, label in enumerate(exp.domain):
        if not _DOMAIN_LABEL.fullmatch(label):
            errors.append(
                ValidationError(
                    "domain.syntax",
                    f"content.domain[{index}]: {label[:40]!r} must be 1-32 of a-z 0-9 _ -, starting with a letter",
                )
            )
    if len(exp.examples) > params.max_examples:
        errors.append(
            ValidationError(
                "limits.examples",
                f"content.examples: {len(exp.examples)} examples, the network allows {params.max_examples}",
            )
        )
    for index, example in enumerate(exp.examples):
        for name, value in (("input", example.input), ("output", example.output)):
            if len(value) > params.max_example_chars:
                errors.append(
                    ValidationError(
                        "limits.example_size",
                        f"content.examples[{index}].{name}: {len(value)} characters, "
                        f"the network allows {params.max_example_chars}",
                    )
                )
    if len(exp.source) > params.max_source_chars:
        errors.append(
            ValidationError("limits.source", f"content.source: longer than {params.max_source_chars} characters")
        )
    errors.extend(_check_embedding(exp, params))
    return errors


def _check_embedding(exp: Experience, params: NetworkParams) -> list[ValidationError]:
    emb = exp.embedding
    if emb.model != params.embedding_model:
        return [
            ValidationError(
                "embedding.model",
                f"content.embedding.model: {emb.model[:60]!r}, the network pins {params.embedding_model!r}",
            )
        ]
    if emb.dim != params.embedding_dim:
        return [
            ValidationError(
                "embedding.dim", f"content.embedding.dim: {emb.dim}, the network pins {params.embedding_dim}"
            )
        ]
    if len(emb.values) != 2 * emb.dim:
        return [
            ValidationError(
                "embedding.size",
                f"content.embedding.values: {len(emb.values)} bytes, expected {2 * emb.dim} (2 bytes per float16)",
            )
        ]
    vector = np.frombuffer(emb.values, dtype="<f2")
    if not np.isfinite(vector).all():
        return [ValidationError("embedding.nonfinite", "content.embedding.values: holds NaN or infinity")]
    if not vector.any():
        return [ValidationError("embedding.zero", "content.embedding.values: is the zero vector")]
    return []


def _check_links(links: tuple[CID, ...], name: str, limit: int) -> list[ValidationError]:
    errors = []
    if len(links) > limit:
        errors.append(ValidationError(f"limits.{name}", f"{name}: {len(links)} links, the network allows {limit}"))
    if any(links[i].raw >= links[i + 1].raw for i in range(len(links) - 1)):
        errors.append(ValidationError(f"{name}.order", f"{name}: must be sorted by binary CID with no duplicates"))
    return errors


def check_operation(
    op: Operation, params: NetworkParams, signing_bytes: bytes | None = None, *, signature: bool = True
) -> list[ValidationError]:
    """Every rule about one decoded operation, its signature included (unless `signature` is False and every
    other rule holds: the caller then checks it, see `SignatureChecks`); empty when valid.

    `signing_bytes` may pass the unsigned encoding when the caller already has it (see Block.signing_bytes).
    """
    if signing_bytes is None:
        signing_bytes = op.signing_bytes()
    errors: list[ValidationError] = []
    author_ok = True
    try:
        public_key_from_did(op.author)
    except IdentityError as exc:
        errors.append(ValidationError(exc.code, exc.message))
        author_ok = False
    if not 1 <= op.clock <= _INT63_MAX:
        errors.append(ValidationError("clock.range", f"clock: {op.clock} is outside [1, 2^63-1]"))
    if not 0 <= op.created <= _INT63_MAX:
        errors.append(ValidationError("created.range", f"created: {op.created} is outside [0, 2^63-1]"))
    errors.extend(_check_links(op.parents, "parents", params.max_parents))
    if op.content is not None:
        errors.extend(_check_experience(op.content, params))
    if op.kind is Kind.MERGE:
        if len(op.targets) < 2:
            errors.append(
                ValidationError(
                    "targets.count", f"targets: a merge needs at least 2 experiences, got {len(op.targets)}"
                )
            )
        errors.extend(_check_links(op.targets, "targets", params.max_merge_targets))
    if op.reason is not None:
        if not op.reason.strip():
            errors.append(ValidationError("reason.empty", "reason: is empty"))
        elif len(op.reason) > params.max_reason_chars:
            errors.append(ValidationError("limits.reason", f"reason: longer than {params.max_reason_chars} characters"))
    if op.kind is Kind.VOTE and op.vote not in (1, -1):
        errors.append(ValidationError("vote.value", f"vote: {op.vote} must be +1 or -1"))
    if len(op.signature) != SIGNATURE_LENGTH:
        errors.append(ValidationError("signature.length", f"signature: {len(op.signature)} bytes, expected 64"))
    elif author_ok and (signature or errors) and not verify_signature(op.author, signing_bytes, op.signature):
        errors.append(_bad_signature())
    return errors


def _bad_signature() -> ValidationError:
    return ValidationError("signature.invalid", "signature: does not verify against the author's key")


#: a batch with at least this many operations has its signatures checked on two worker threads (Ed25519
#: verification releases the GIL, so they use the second core); smaller ones on the caller's thread
_THREADED_BATCH = 512
#: signatures handed to a worker at a time: a worker starts while the caller decodes the rest of the batch
_SIGNATURE_CHUNK = 64
#: texts embedded between two pauses of the embedding check (~2 ms of the writer's CPU)
_EMBED_CHUNK = 16
_verifiers: ThreadPoolExecutor | None = None
_verifiers_lock = threading.Lock()


class SignatureChecks:
    """The signatures of a batch, checked on the `ledger-verify` threads while the caller goes on decoding.

    libsodium runs without the GIL, so the writer's largest single cost (~100 us per operation)
    moves off its thread, and overlaps with decoding the rest of the batch instead of following
    it (the writer waited ~0.9 s per 10,000 operations for the workers at 100k). The verdicts are
    the same as `check_operation`'s. The workers call `pause()` between signatures, as the writer
    does between operations: with the writer decoding, two of them left a query on 2 cores a
    third of a core, and 7 of the 8 slowest queries of a 1M window ran while they did.
    """

    def __init__(self, batch_size: int, pause: Callable[[], None] = NEVER.pause) -> None:
        """`batch_size`: how many operations the batch has (small batches are checked on the caller's thread);
        `pause()` is called between signatures (reads go first)."""
        self._pause = pause
        global _verifiers
        self._added: list[Block] = []
        self._waiting: list[Block] = []
        self._futures: list[Future[list[ValidationError | None]]] = []
        self._pool: ThreadPoolExecutor | None = None
        if batch_size >= _THREADED_BATCH:
            with _verifiers_lock:
                if _verifiers is None:
                    _verifiers = ThreadPoolExecutor(2, thread_name_prefix="ledger-verify")
            self._pool = _verifiers

    def add(self, block: Block) -> None:
        """A block that passed `examine(..., signature=False)`: its signature is checked soon."""
        self._added.append(block)
        self._waiting.append(block)
        if self._pool is not None and len(self._waiting) >= _SIGNATURE_CHUNK:
            self._futures.append(self._pool.submit(_verify_chunk, self._waiting, self._pause))
            self._waiting = []

    def verdicts(self) -> dict[bytes, ValidationError | None]:
        """The verdict of each added block, by CID (waits for the workers)."""
        rest = _verify_chunk(self._waiting, self._pause)
        found = [verdict for future in self._futures for verdict in future.result()] + rest
        return {block.cid.raw: verdict for block, verdict in zip(self._added, found, strict=True)}


def _verify_chunk(blocks: Sequence[Block], pause: Callable[[], None]) -> list[ValidationError | None]:
    verdicts: list[ValidationError | None] = []
    for block in blocks:
        pause()
        good = verify_signature(block.op.author, block.signing_bytes(), block.op.signature)
        verdicts.append(None if good else _bad_signature())
    return verdicts


def examine(
    data: bytes,
    params: NetworkParams,
    expected_cid: CID | None = None,
    *,
    signature: bool = True,
    decoded: Block | None = None,
) -> tuple[Block | None, list[LedgerError]]:
    """Decode and check `data`, collecting every failure (for `expledger op inspect` and RPC error details).

    With `signature` False, the signature of an operation that breaks no other rule is left to the
    caller (`SignatureChecks`, which checks a batch on two threads). `decoded`: `data` as `decode_block` made it
    in this process (p2p decodes what it receives), checked without decoding the bytes again."""
    if len(data) > params.max_op_bytes:
        return None, [
            ValidationError(
                "limits.op_bytes", f"operation: {len(data)} bytes, the network allows {params.max_op_bytes}"
            )
        ]
    try:
        block = decoded if decoded is not None and decoded.data is data else decode_block(data)
    except LedgerError as exc:
        return None, [exc]
    errors: list[LedgerError] = []
    if expected_cid is not None and block.cid != expected_cid:
        errors.append(
            ValidationError("cid.mismatch", f"cid: content hashes to {block.cid}, not the claimed {expected_cid}")
        )
    errors.extend(check_operation(block.op, params, block.signing_bytes(), signature=signature or bool(errors)))
    return block, errors


def validate(data: bytes, params: NetworkParams, expected_cid: CID | None = None) -> Block:
    """Decode and fully check one operation; raise the first failure (a LedgerError) or return the Block."""
    block, errors = examine(data, params, expected_cid)
    if errors:
        raise errors[0]
    assert block is not None
    return block


def check_embeddings(
    blocks: Sequence[Block], embedder: Embedder, params: NetworkParams, pause: Callable[[], None] = NEVER.pause
) -> dict[bytes, ValidationError]:
    """Operations whose embedding is not the network model's embedding of their text (format seed 2), by CID.

    A wrong embedding is an attack: it would push an experience into unrelated prompts. The
    verdict is exact (integer arithmetic), so every node reaches the same one. Texts are embedded and
    judged `_EMBED_CHUNK` at a time with `pause()` between chunks (reads go first): a batch's texts in one
    call held the writer for ~50 ms with no point at which a query could go first.
    """
    contents = [(block.cid.raw, block.op.content) for block in blocks if block.op.content is not None]
    epsilon = Fraction(params.embedding_epsilon)
    found = {}
    for start in range(0, len(contents), _EMBED_CHUNK):
        pause()
        chunk = contents[start : start + _EMBED_CHUNK]
        directions = embedder.directions([content.text for _, content in chunk])
        values = [content.embedding.values for _, content in chunk]
        verdicts = within_distances(values, directions, epsilon)
        for (cid, content), direction, agrees in zip(chunk, directions, verdicts, strict=True):
            if not agrees:
                distance = float(np.linalg.norm(unpack_float16(content.embedding.values) - unit(direction)))
                found[cid] = ValidationError(
                    "embedding.inconsistent",
                    f"content.embedding: {distance:.4f} (L2) from this node's embedding of the text, "
                    f"the network allows {params.embedding_epsilon}",
                )
    return found
