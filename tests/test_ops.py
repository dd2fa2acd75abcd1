"""Operations: encode/decode identity, schema errors naming the field, tamper evidence at every byte."""

import contextlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ledger import codec
from ledger.errors import LedgerError
from ledger.ops import Block, Kind, SchemaError, decode_block
from ledger.validation import examine, validate
from tests import factories as f
from tests.strategies import operations


@given(operations())
def test_encode_decode_encode_is_identity_for_operations(op):
    data = codec.encode(op.record())
    block = decode_block(data)
    assert block.op == op
    assert codec.encode(block.op.record()) == data


@given(operations())
def test_signing_bytes_taken_from_the_encoding_equal_a_fresh_encoding(op):
    data = codec.encode(op.record())
    assert decode_block(data).signing_bytes() == op.signing_bytes()


@given(st.binary(max_size=300))
def test_decoding_arbitrary_bytes_raises_only_ledger_errors(data):
    with contextlib.suppress(LedgerError):
        decode_block(data)


@given(st.data())
def test_mutated_operations_never_raise_outside_the_error_family(data):
    block = f.add()
    raw = bytearray(block.data)
    for _ in range(data.draw(st.integers(1, 4))):
        position = data.draw(st.integers(0, len(raw) - 1))
        raw[position] = data.draw(st.integers(0, 255))
    _, errors = examine(bytes(raw), f.PARAMS)
    if bytes(raw) != block.data:
        assert errors and all(isinstance(e, LedgerError) for e in errors)


def _tamper_targets() -> list[Block]:
    g0, g1 = f.add(), f.add(f.SEED_TEXTS[1], f.author(2))
    return [
        g0,
        f.signed(f.operation(Kind.DELETE, clock=2, parents=(g0.cid,), target=g0.cid, reason="wrong")),
        f.signed(
            f.operation(
                Kind.MERGE, targets=tuple(sorted((g0.cid, g1.cid))), content=f.content(f.SEED_TEXTS[2]), reason="same"
            )
        ),
        f.signed(f.operation(Kind.VOTE, target=g1.cid, vote=-1), f.author(3)),
    ]


@pytest.mark.parametrize("block", _tamper_targets(), ids=["add", "delete", "merge", "vote"])
def test_flipping_any_single_byte_is_detected(block):
    validate(block.data, f.PARAMS)
    for position in range(len(block.data)):
        for mask in (0x01, 0x80, 0xFF):
            tampered = bytearray(block.data)
            tampered[position] ^= mask
            with pytest.raises(LedgerError):
                validate(bytes(tampered), f.PARAMS)


def _record_without(field: str, **changes: object) -> dict:
    rec = f.add().op.record()
    rec.pop(field, None)
    rec.update(changes)
    return rec


@pytest.mark.parametrize(
    ("record", "code", "field"),
    [
        (_record_without("clock"), "schema.missing", "clock"),
        (_record_without("kind", kind="rename"), "schema.kind", "kind"),
        (_record_without("version", version=2), "schema.version", "version"),
        (_record_without("clock", clock="7"), "schema.type", "clock"),
        (_record_without("extra", extra=1), "schema.unknown_field", "extra"),
        (_record_without("target", target=f.add().cid), "schema.unknown_field", "target"),
        (_record_without("parents", parents=["bafy"]), "schema.type", "parents[0]"),
        ([1, 2], "schema.type", "operation"),
    ],
)
def test_schema_errors_name_the_field(record, code, field):
    with pytest.raises(SchemaError) as caught:
        decode_block(codec.encode(record))
    assert caught.value.code == code
    assert caught.value.message.startswith(field)


def test_nested_schema_errors_name_the_nested_field():
    rec = f.add().op.record()
    rec["content"]["confidence"] = 1
    with pytest.raises(SchemaError, match=r"content\.confidence: expected float"):
        decode_block(codec.encode(rec))
    rec = f.add().op.record()
    rec["content"]["examples"] = [{"input": "a", "output": "b"}]
    with pytest.raises(SchemaError, match=r"content\.examples\[0\]\.correct: required"):
        decode_block(codec.encode(rec))
