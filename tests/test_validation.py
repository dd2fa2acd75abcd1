"""Every stateless rule: one operation that passes it and one that breaks it, with the error code."""

import threading
import time
from dataclasses import replace

import numpy as np
import pytest

from ledger import codec
from ledger.cid import CID
from ledger.embedder import embedder_for, pack_float16
from ledger.ops import Embedding, Example, Kind
from ledger.params import NetworkParams
from ledger.priority import ReadPriority
from ledger.validation import (
    _THREADED_BATCH,
    SignatureChecks,
    check_embeddings,
    check_text,
    count_tokens,
    examine,
    validate,
)
from tests import factories as f

PARAMS = f.PARAMS


def codes(data: bytes, params: NetworkParams = PARAMS, expected_cid: CID | None = None) -> list[str]:
    return [error.code for error in examine(data, params, expected_cid)[1]]


def text_codes(text: str, params: NetworkParams = PARAMS) -> list[str]:
    return [error.code for error in check_text(text, params)]


@pytest.mark.parametrize("text", f.SEED_TEXTS)
def test_the_four_seed_experiences_are_valid(text):
    assert codes(f.add(text).data) == []


@pytest.mark.parametrize(
    "text",
    [
        "When a proof stalls, try the contrapositive.",
        "For sums over divisors, pair each divisor with its complement.",
        "If a sequence looks periodic, verify the period on a few more terms, then generalise.",
        "A monotone bounded sequence implies convergence, so prove both properties first.",
        "When splitting into 2 cases, check the cases cover everything.",
        "For 3D geometry problems, project onto a plane, then solve there.",
    ],
)
def test_strategic_texts_pass_structure_and_generality(text):
    assert text_codes(text) == []


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ("Always check your work carefully before answering.", "text.structure"),
        ("When checking work carefully before answering.", "text.structure"),
        ("Solve x^2 = 4 by taking square roots.", "text.generality.equation"),
        ("When solving x^2 = 4, take square roots.", "text.generality.equation"),
        ("When solving quadratics, note that x^2 has two roots.", "text.generality.expression"),
        ("When given 3x plus a constant, isolate the variable.", "text.generality.expression"),
        ("When the answer is 42, double check it.", "text.generality.number"),
        ("When a probability is 0.25, consider complements.", "text.generality.number"),
        ("When a point is at (3,4), measure from the origin.", "text.generality.number"),
        ("When a point is at (3, 4), measure from the origin.", "text.generality.number"),
        ("When solving with 2 cases, check 37 values.", "text.generality.number"),
        ("", "text.empty"),
        ("   ", "text.empty"),
        ("When a line breaks,\nkeep it on one line.", "text.control"),
        # invisible and direction-changing characters (§6.2): a visually identical copy must not pass
        ("When solving geo\u200bmetry problems, check the bounds.", "text.character"),
        ("When solving geometry problems, \u202echeck the bounds.", "text.character"),
        ("When solving \u2066geometry\u2069 problems, check the bounds.", "text.character"),
        ("When solving geometry\u2060 problems, check the bounds.", "text.character"),
        ("\ufeffWhen solving geometry problems, check the bounds.", "text.character"),
        ("When solving geo\u00admetry problems, check the bounds.", "text.character"),
        ("When solving geometry\u00a0problems, check the bounds.", "text.character"),
        ("When solving geometry problems, check the bounds\ue000.", "text.character"),
        ("When solving geometry problems, check the bounds \U0001f600.", "text.character"),
        ("When a cafe\u0301 problem appears, check the bounds.", "text.normalization"),
        ("When " + "very " * 40 + "long, stop.", "text.length"),
    ],
)
def test_text_rules_reject_with_their_code(text, code):
    assert code in text_codes(text)


@pytest.mark.parametrize(
    "text",
    [
        "When a café problem appears, check the bounds.",
        "When solving 数学 problems, check the bounds.",
        "When a Δ-method applies, check the variance.",
    ],
)
def test_visible_text_in_normal_form_c_passes(text):
    assert text_codes(text) == []


def test_characters_are_judged_by_the_frozen_unicode_database():
    # U+2066 became a format character in Unicode 6.3; under UCD 3.2 it is unassigned: refused either way,
    # and the verdict does not depend on the Unicode version of the interpreter
    assert text_codes("When a \u2066 isolate appears, check the bounds.") == ["text.character"]


def test_a_long_run_of_spaces_is_judged_quickly():
    # the "implies" pattern once backtracked quadratically here (~30 s for this text)
    assert "text.structure" in text_codes("a" + " " * 60_000 + "b")


def test_text_limit_in_tokens_is_expressible():
    tokens = NetworkParams(text_unit="tokens", text_max=256)
    long_text = "When " + "a, " * 120 + "stop."
    assert count_tokens(long_text) > 200
    assert "text.length" not in text_codes("When " + "word " * 200 + "ends, stop.", tokens)
    assert "text.length" in text_codes(long_text + " and more, more, more, more, more, more, more", tokens)
    assert "text.length" in text_codes("When " + "word " * 40 + "ends, stop.", PARAMS)


def _add_with(**content_changes: object) -> bytes:
    block = f.add()
    return f.with_fields(block, content=replace(block.op.content, **content_changes)).data


@pytest.mark.parametrize(
    ("changes", "code"),
    [
        ({"confidence": 1.5}, "confidence.range"),
        ({"confidence": -0.01}, "confidence.range"),
        ({"domain": ()}, "domain.depth"),
        ({"domain": ("a",) * 9}, "domain.depth"),
        ({"domain": ("Math",)}, "domain.syntax"),
        ({"domain": ("math", "geo metry")}, "domain.syntax"),
        ({"domain": ("9lives",)}, "domain.syntax"),
        ({"examples": (Example("i", "o", True),) * 9}, "limits.examples"),
        ({"examples": (Example("i" * 2001, "o", True),)}, "limits.example_size"),
        ({"source": "s" * 201}, "limits.source"),
        ({"embedding": Embedding("other-model", 256, bytes(512))}, "embedding.model"),
        ({"embedding": Embedding("feature-hash-v1", 128, bytes(256))}, "embedding.dim"),
        ({"embedding": Embedding("feature-hash-v1", 256, bytes(510))}, "embedding.size"),
        ({"embedding": Embedding("feature-hash-v1", 256, pack_float16(np.full(256, np.inf)))}, "embedding.nonfinite"),
        ({"embedding": Embedding("feature-hash-v1", 256, bytes(512))}, "embedding.zero"),
    ],
)
def test_content_rules_reject_with_their_code(changes, code):
    assert codes(_add_with(**changes)) == [code]


@pytest.mark.parametrize(
    "changes",
    [
        {"confidence": 0.0},
        {"confidence": 1.0},
        {"domain": ("a",) * 8},
        {"domain": ("math", "geometry", "intersection_2d")},
        {"examples": (Example("i" * 2000, "o", False),) * 8},
        {"source": "s" * 200},
    ],
)
def test_content_rules_accept_values_at_their_limits(changes):
    assert codes(_add_with(**changes)) == []


def test_link_rules():
    a, b, c = sorted(f.add(text).cid for text in f.SEED_TEXTS[:3])
    merge = f.signed(f.operation(Kind.MERGE, targets=(a, b), content=f.content(), reason="same"))
    assert codes(merge.data) == []
    assert codes(f.with_fields(merge, targets=(b, a)).data) == ["targets.order"]
    assert codes(f.with_fields(merge, targets=(a, a)).data) == ["targets.order"]
    assert codes(f.with_fields(merge, targets=(a,)).data) == ["targets.count"]
    assert codes(f.with_fields(merge, targets=tuple(sorted(f.add(str(i)).cid for i in range(17)))).data) == [
        "limits.targets"
    ]
    assert codes(f.with_fields(merge, parents=(c, a)).data) == ["parents.order"]
    many = tuple(sorted(CID.for_block(bytes([i])) for i in range(65)))
    assert codes(f.with_fields(merge, parents=many).data) == ["limits.parents"]
    assert codes(f.with_fields(merge, parents=many[:64]).data) == []


def test_reason_vote_clock_and_created_rules():
    target = f.add().cid
    delete = f.signed(f.operation(Kind.DELETE, target=target, reason="obsolete"))
    assert codes(delete.data) == []
    assert codes(f.with_fields(delete, reason=" ").data) == ["reason.empty"]
    assert codes(f.with_fields(delete, reason="r" * 501).data) == ["limits.reason"]
    assert codes(f.with_fields(delete, clock=0).data) == ["clock.range"]
    assert codes(f.with_fields(delete, clock=2**63).data) == ["clock.range"]
    assert codes(f.with_fields(delete, created=-1).data) == ["created.range"]
    vote = f.signed(f.operation(Kind.VOTE, target=target, vote=1))
    assert codes(vote.data) == []
    assert codes(f.with_fields(vote, vote=-1).data) == []
    assert codes(f.with_fields(vote, vote=0).data) == ["vote.value"]
    assert codes(f.with_fields(vote, vote=2).data) == ["vote.value"]


def test_author_signature_and_cid_rules():
    block = f.add()
    assert codes(block.data, expected_cid=block.cid) == []
    assert codes(block.data, expected_cid=f.add(f.SEED_TEXTS[1]).cid) == ["cid.mismatch"]

    rec = block.op.record()
    rec["author"] = "did:key:z6MkBadKey"
    assert codes(codec.encode(rec)) == ["author.did"]
    rec["author"] = f.author(2).did  # someone else's key: the signature no longer verifies
    assert codes(codec.encode(rec)) == ["signature.invalid"]
    rec = block.op.record()
    rec["signature"] = rec["signature"][:63]
    assert codes(codec.encode(rec)) == ["signature.length"]
    rec = block.op.record()
    rec["content"]["confidence"] = 0.88  # content changed after signing
    assert codes(codec.encode(rec)) == ["signature.invalid"]


def test_operation_size_limit():
    block = f.add()
    assert codes(block.data, replace(PARAMS, max_op_bytes=len(block.data))) == []
    assert codes(block.data, replace(PARAMS, max_op_bytes=len(block.data) - 1)) == ["limits.op_bytes"]


def test_every_failed_rule_is_reported_and_validate_raises_the_first():
    block = f.add()
    broken = f.with_fields(block, clock=0, content=replace(block.op.content, confidence=2.0, domain=("Bad",)))
    assert codes(broken.data) == ["clock.range", "confidence.range", "domain.syntax"]
    with pytest.raises(Exception) as caught:
        validate(broken.data, PARAMS)
    assert caught.value.code == "clock.range"


def test_redundant_content_is_not_a_stateless_error():
    first, again = f.add(), f.add(key=f.author(2))
    assert first.op.content == again.op.content
    assert codes(first.data) == codes(again.data) == []


def test_the_embedding_check_lets_reads_go_first_between_chunks_and_finds_every_forgery():
    """The writer embeds a batch's texts a chunk at a time, pausing between chunks for queries in flight."""
    blocks = [
        f.add(f"When checking embedding {'abcdefghij'[i % 10]}{'klmnopqrst'[i // 10]}, verify it.") for i in range(40)
    ]
    forged = {3, 17, 39}
    for index in forged:
        wrong = replace(blocks[index].op.content, embedding=f.embedding("an unrelated text"))
        blocks[index] = f.with_fields(blocks[index], content=wrong)
    pauses = []
    found = check_embeddings(blocks, embedder_for(f.PARAMS), f.PARAMS, pause=lambda: pauses.append(1))
    assert set(found) == {blocks[index].cid.raw for index in forged}
    assert {error.code for error in found.values()} == {"embedding.inconsistent"}
    assert len(pauses) >= 3  # 40 texts: at least one pause per 16


def test_the_signature_workers_give_way_to_a_read_in_flight() -> None:
    """The ledger-verify threads call pause() between signatures, as the writer does between operations: while a
    read is in flight no chunk of signatures is done (two of them beside the writer left a query on 2 cores a third
    of a core); once it ends every verdict comes."""
    priority = ReadPriority(longest=60)
    blocks = [
        f.signed(f.operation(Kind.ADD, content=f.content(f"When checking case {n}, verify the bounds.")))
        for n in range(_THREADED_BATCH)
    ]
    release, paused_in_worker = threading.Event(), threading.Event()

    def read() -> None:
        with priority.reading():
            release.wait(60)

    def pause() -> None:
        if threading.current_thread().name.startswith("ledger-verify") and priority.reading_now:
            paused_in_worker.set()
        priority.pause()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    while not priority.reading_now:
        time.sleep(0.001)
    checks = SignatureChecks(len(blocks), pause)
    for block in blocks:
        checks.add(block)
    assert paused_in_worker.wait(30), "no worker paused for the read"
    assert not any(future.done() for future in checks._futures)
    release.set()
    reader.join(30)
    assert list(checks.verdicts().values()) == [None] * len(blocks)
