"""Strict DAG-CBOR: one byte form per value; anything else is a DecodeError, never another exception."""

import hashlib

import pytest
from hypothesis import given
from hypothesis import strategies as st
from multiformats import CID as ReferenceCID
from multiformats import multihash

from ledger import codec
from ledger.cid import CID, CIDError

LINK = CID.for_block(b"\xa0")

dag_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**64), max_value=2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False).filter(lambda x: str(x) != "-0.0")
    | st.text()
    | st.binary()
    | st.binary(min_size=32, max_size=32).map(lambda d: CID.for_block(d))
)
dag_values = st.recursive(
    dag_scalars,
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=8), children, max_size=5),
    max_leaves=30,
)


@given(dag_values)
def test_encode_decode_encode_is_identity(value):
    data = codec.encode(value)
    decoded = codec.decode(data)
    assert codec.encode(decoded) == data


@given(st.binary(max_size=200))
def test_arbitrary_bytes_raise_only_decode_error(data):
    try:
        value = codec.decode(data)
    except codec.DecodeError as exc:
        assert exc.code.startswith("codec.")
    else:
        assert codec.encode(value) == data


def test_floats_are_always_64_bit_and_keys_length_first():
    assert codec.encode(0.5).hex() == "fb3fe0000000000000"
    assert codec.encode(1.0).hex() == "fb3ff0000000000000"
    assert codec.encode({"bb": 1, "a": 2, "c": 3}) == bytes.fromhex("a36161026163036262620" + "1")
    assert codec.encode(LINK).hex().startswith("d82a58250001711220")


@pytest.mark.parametrize(
    ("hex_bytes", "code"),
    [
        ("f93800", "codec.non_canonical"),  # 0.5 as a half float
        ("fa3f000000", "codec.non_canonical"),  # 0.5 as a single float
        ("1801", "codec.non_canonical"),  # 1 in two bytes
        ("a2616201616101", "codec.non_canonical"),  # keys out of order
        ("a2616101616102", "codec.malformed"),  # duplicate key
        ("0102", "codec.non_canonical"),  # trailing bytes
        ("9f01ff", "codec.malformed"),  # indefinite length
        ("f7", "codec.type"),  # undefined
        ("f97e00", "codec.float"),  # NaN
        ("f97c00", "codec.float"),  # infinity
        ("c11a514b67b0", "codec.tag"),  # tag 1 (epoch time)
        ("d82b01", "codec.tag"),  # unknown tag
        ("c24101", "codec.tag"),  # bignum
        ("d81c8161" + "78", "codec.tag"),  # a shareable value (tag 28)
        ("d9d9f701", "codec.tag"),  # self-described CBOR
        ("a1016161", "codec.key_type"),  # integer key
        ("d82a420001", "codec.cid"),  # link that is not dag-cbor/sha2-256
        ("d82a4101", "codec.cid"),  # link without the 0x00 multibase prefix
        ("", "codec.malformed"),
        ("62ff00", "codec.malformed"),  # invalid UTF-8
        ("81" * 40 + "01", "codec.depth"),  # nesting too deep
        ("81" * 33 + "01", "codec.depth"),  # 33 nested containers: one too many
        ("fb8000000000000000", "codec.negative_zero"),
        ("d82a5823" + "00" + "1220" + "11" * 32, "codec.cid"),  # a CIDv0 link (bare sha2-256 multihash)
        ("d82a5825" + "00" + "015512" + "20" + "11" * 32, "codec.cid"),  # a raw-codec CIDv1 link
        ("d82a5825" + "00" + "017013" + "20" + "11" * 32, "codec.cid"),  # dag-pb with sha2-512 code
    ],
)
def test_non_canonical_and_foreign_forms_are_rejected_with_their_code(hex_bytes, code):
    with pytest.raises(codec.DecodeError) as caught:
        codec.decode(bytes.fromhex(hex_bytes))
    assert caught.value.code == code


@pytest.mark.parametrize(
    ("value", "code"),
    [
        (float("nan"), "codec.float"),
        (-0.0, "codec.negative_zero"),
        (2**64, "codec.int_range"),
        ({1: 2}, "codec.key_type"),
        ({1, 2}, "codec.type"),
    ],
)
def test_values_outside_the_data_model_are_not_encoded(value, code):
    with pytest.raises(codec.EncodeError) as caught:
        codec.encode(value)
    assert caught.value.code == code


def _shared_bomb(levels: int) -> bytes:
    """28([L, 29(i)]) nested: each level doubles the value once references are expanded."""

    def level(k: int, index: int) -> bytes:
        if k == 0:
            return b"\xd8\x1c\x81\x61x"
        inner = level(k - 1, index + 1)
        ref = bytes([0x18, index + 1]) if index + 1 >= 24 else bytes([index + 1])
        return b"\xd8\x1c\x82" + inner + b"\xd8\x1d" + ref

    return level(levels, 0)


@pytest.mark.parametrize(
    "data",
    [
        _shared_bomb(12),
        b"\x9a\x00\x00\x40\x00" + b"\xd8\x1d\x00" * 16384,  # many references to one shared value
        b"\xc2\x59\x08\x00" + b"\xff" * 2048,  # a 16,384-bit bignum
        b"\xd9\x01\x00\x82\x63abc\xd8\x19\x00",  # string references
    ],
)
def test_expanding_and_huge_forms_are_refused_before_they_expand(data):
    with pytest.raises(codec.DecodeError) as caught:
        codec.decode(data)
    assert caught.value.code in ("codec.tag", "codec.malformed")


def test_thirty_two_nested_containers_are_the_limit():
    value = 0
    for _ in range(32):
        value = [value]
    assert codec.decode(codec.encode(value)) == value
    with pytest.raises(codec.EncodeError) as caught:
        codec.encode([value])
    assert caught.value.code == "codec.depth"


def test_decode_rejects_non_bytes():
    with pytest.raises(codec.DecodeError):
        codec.decode("a0")  # type: ignore[arg-type]


@given(st.binary(min_size=1, max_size=64))
def test_cid_matches_multiformats(data):
    reference = ReferenceCID("base32", 1, "dag-cbor", multihash.wrap(hashlib.sha256(data).digest(), "sha2-256"))
    ours = CID.for_block(data)
    assert str(ours) == str(reference)
    assert ours.raw == bytes(reference)
    assert CID.parse(str(reference)) == ours
    assert CID.parse(reference.encode("base58btc")) == ours


_BASE32 = "abcdefghijklmnopqrstuvwxyz234567"


@given(st.binary(min_size=1, max_size=64), st.integers(0, 58), st.sampled_from(_BASE32 + "A18=-"))
def test_cid_parse_takes_and_refuses_what_multiformats_does(data, position, letter):
    """The canonical form is decoded without multiformats: a one-letter change anywhere must fare the same way."""
    text = str(CID.for_block(data))
    altered = text[:position] + letter + text[position + 1 :]
    try:
        expected = bytes(ReferenceCID.decode(altered))
    except Exception:
        expected = None
    if expected is not None and not expected.startswith(CID.for_block(b"").raw[:4]):
        expected = None  # another codec or hash, which CID.parse refuses
    try:
        got = CID.parse(altered).raw
    except CIDError:
        got = None
    assert got == expected


@pytest.mark.parametrize(
    "text",
    [
        "",
        "not a cid",
        "QmYwAPJzv5CZsnA625s3Xf2nemtYgPpHdWEz79ojWnPbdG",  # CIDv0 (dag-pb)
        "bafkreihdwdcefgh4dqkjv67uzcmw7ojee6xedzdetojuzjevtenxquvyku",  # raw codec
    ],
)
def test_cid_parse_rejects_other_kinds_with_a_clear_error(text):
    with pytest.raises(CIDError) as caught:
        CID.parse(text, field="target")
    assert caught.value.code == "cid.invalid"
    assert "target" in caught.value.message


def test_cids_order_by_binary_form():
    cids = [CID.for_block(bytes([i])) for i in range(20)]
    assert [c.raw for c in sorted(cids)] == sorted(c.raw for c in cids)


@given(st.lists(st.binary(min_size=1, max_size=8), max_size=300), st.booleans())
def test_links_assembled_as_bytes_pack_as_the_cids_do(blocks, none):
    """Every length of list head up to two bytes (23, 24, 255, 256 items), and None for a missing link."""
    cids = [CID.for_block(data) for data in blocks]
    assert codec.pack_links(cids) == codec.pack(cids)
    assert codec.unpack(codec.pack_links(cids)) == cids
    link = None if none or not cids else cids[0]
    assert codec.pack_link(link) == codec.pack(link)
    items = [codec.pack(len(cids)), codec.pack_links(cids), codec.pack_link(link)]
    assert codec.pack_array(items) == codec.pack([len(cids), cids, link])
