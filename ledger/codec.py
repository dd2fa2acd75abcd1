"""Strict DAG-CBOR, so that one value has exactly one byte form and therefore one CID.

`cbor2.dumps(canonical=True)` is not enough: it shortens floats. We sort map keys ourselves
(length first, then bytewise) and let cbor2 write every float as 64-bit, which is DAG-CBOR.
Decoding re-encodes and compares, which rejects every non-canonical form at once.
"""

from __future__ import annotations

import math
from typing import Any

import cbor2

from ledger.cid import CID, CIDError
from ledger.errors import LedgerError

CID_TAG = 42
_MAX_DEPTH = 32
_INT_MIN = -(2**64)
_INT_MAX = 2**64 - 1
_SCALARS = (str, bytes, bool, type(None))


class EncodeError(LedgerError):
    """A value outside the DAG-CBOR data model (NaN, a big int, a non-string key, an unknown type)."""


class DecodeError(LedgerError):
    """Bytes that are not exactly one canonical DAG-CBOR value."""


def _key_order(key: str) -> tuple[int, str]:
    """DAG-CBOR map order: UTF-8 length first, then bytewise (code point order equals UTF-8 byte order)."""
    return len(key.encode("utf-8")), key


#: sorted key order per key tuple; operations reuse a handful of shapes, so this saves the sort
_ORDER_CACHE: dict[tuple[str, ...], tuple[str, ...]] = {}
_ORDER_CACHE_LIMIT = 1024


def _sorted_keys(mapping: dict[str, Any]) -> tuple[str, ...]:
    shape = tuple(mapping)
    order = _ORDER_CACHE.get(shape)
    if order is None:
        order = tuple(sorted(shape, key=_key_order))
        if len(_ORDER_CACHE) < _ORDER_CACHE_LIMIT and len(shape) <= 16 and all(len(k) <= 16 for k in shape):
            _ORDER_CACHE[shape] = order
    return order


def _canonical(value: Any, depth: int = 0) -> Any:
    """Copy `value` into what cbor2 writes as DAG-CBOR; raise EncodeError for anything outside the model."""
    if depth > _MAX_DEPTH:
        raise EncodeError("codec.depth", f"nesting deeper than {_MAX_DEPTH}")
    kind = type(value)
    if kind is str and not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise EncodeError("codec.utf8", f"a string holds {exc.reason} at character {exc.start}") from None
        return value
    if kind in _SCALARS:
        return value
    if kind is int:
        if not _INT_MIN <= value <= _INT_MAX:
            raise EncodeError("codec.int_range", f"integer of {value.bit_length()} bits does not fit in 64 bits")
        return value
    if kind is float:
        if not math.isfinite(value):
            raise EncodeError("codec.float", f"{value} is not allowed (DAG-CBOR forbids NaN and infinities)")
        if value == 0.0 and math.copysign(1.0, value) < 0:
            raise EncodeError("codec.negative_zero", "-0.0 is not allowed (a peer that reads it as 0 gets another CID)")
        return value
    if kind is dict:
        for key in value:
            if type(key) is not str:
                raise EncodeError("codec.key_type", f"map key {key!r} is not a string")
            if not key.isascii():
                _canonical(key, depth + 1)  # refuses a key that is not UTF-8
        return {key: _canonical(value[key], depth + 1) for key in _sorted_keys(value)}
    if kind is list or kind is tuple:
        return [_canonical(item, depth + 1) for item in value]
    if kind is CID:
        return cbor2.CBORTag(CID_TAG, b"\x00" + value.raw)
    raise EncodeError("codec.type", f"{kind.__name__} is not in the DAG-CBOR data model")


def encode(value: Any) -> bytes:
    """Encode `value` (dicts, lists, str, bytes, int, float, bool, None, CID) as strict DAG-CBOR."""
    return cbor2.dumps(_canonical(value))


def _tag_hook(tag: cbor2.CBORTag, _immutable: bool) -> CID:
    if tag.tag != CID_TAG:
        raise DecodeError("codec.tag", f"tag {tag.tag} is not allowed (only 42, a CID link)")
    link = tag.value
    if type(link) is not bytes or not link.startswith(b"\x00"):
        raise DecodeError("codec.cid", "tag 42 must hold bytes starting with the identity multibase 0x00")
    try:
        return CID(link[1:])
    except CIDError as exc:
        raise DecodeError("codec.cid", exc.message) from None


def _refuse_tag(tag: int) -> Any:
    def refuse(*_: Any) -> Any:
        raise DecodeError("codec.tag", f"tag {tag} is not allowed (only 42, a CID link)")

    return refuse


#: every tag cbor2 would otherwise interpret itself. Shared values (28/29) and string references
#: (25/256) expand exponentially when re-encoded, and bignums (2/3) make huge ints: refuse them
#: as soon as they are read, before any expansion.
_NATIVE_TAGS = (0, 1, 2, 3, 4, 5, 25, 28, 29, 30, 35, 36, 37, 52, 54, 100, 256, 258, 260, 261, 1004, 55799)
_REFUSE_NATIVE = {tag: _refuse_tag(tag) for tag in _NATIVE_TAGS}


def decode(data: bytes) -> Any:
    """Decode exactly one canonical DAG-CBOR value; any other input raises DecodeError and nothing else."""
    if type(data) is not bytes:
        raise DecodeError("codec.input", f"expected bytes, got {type(data).__name__}")
    try:
        value = cbor2.loads(
            data,
            tag_hook=_tag_hook,
            semantic_decoders=_REFUSE_NATIVE,
            allow_indefinite=False,
            allow_duplicate_keys=False,
            max_depth=_MAX_DEPTH,
        )
    except DecodeError:
        raise
    except Exception as exc:  # cbor2 raises many types (CBORDecodeError, ValueError, RecursionError, ...)
        if isinstance(exc.__cause__, DecodeError) or isinstance(exc.__context__, DecodeError):
            raise (exc.__cause__ or exc.__context__) from None
        if "nesting depth" in str(exc):
            raise DecodeError("codec.depth", f"nesting deeper than {_MAX_DEPTH}") from None
        raise DecodeError("codec.malformed", f"not valid CBOR: {exc}") from None
    try:
        canonical = encode(value)
    except EncodeError as exc:
        raise DecodeError(exc.code, exc.message) from None
    except Exception as exc:  # anything else the decoded value provokes is still just bad input
        raise DecodeError("codec.malformed", f"cannot re-encode the decoded value ({type(exc).__name__})") from None
    if canonical != data:
        raise DecodeError(
            "codec.non_canonical",
            "not the canonical DAG-CBOR form (unsorted or duplicate keys, short floats, "
            "non-minimal integers, extra bytes or a tag other than 42)",
        )
    return value


def _encode_link(encoder: cbor2.CBOREncoder, value: Any) -> None:
    if type(value) is not CID:
        raise EncodeError("codec.type", f"{type(value).__name__} is not in the DAG-CBOR data model")
    encoder.encode(cbor2.CBORTag(CID_TAG, b"\x00" + value.raw))


def pack(value: Any) -> bytes:
    """Encode the node's own derived state fast: the DAG-CBOR data model, but maps keep their order.

    Not for anything hashed, signed or sent: those use `encode`.
    """
    return cbor2.dumps(value, default=_encode_link)


def _head(major: int, length: int) -> bytes:
    """A CBOR item's head with the shortest length, as cbor2 writes it."""
    if length < 24:
        return bytes([major << 5 | length])
    for extra, size in ((24, 1), (25, 2), (26, 4)):
        if length < 1 << (8 * size):
            return bytes([major << 5 | extra]) + length.to_bytes(size, "big")
    return bytes([major << 5 | 27]) + length.to_bytes(8, "big")


#: the bytes before a CID's raw bytes in `pack`'s output, by the CID's length: tag 42, then a byte string of
#: the identity multibase 0x00 and the CID
_LINK_HEADS = {size: b"\xd8\x2a" + _head(2, size + 1) + b"\x00" for size in range(34, 72)}


def pack_link(cid: CID | None) -> bytes:
    """What `pack` writes for one CID (or None)."""
    if cid is None:
        return b"\xf6"
    raw = cid.raw
    return (_LINK_HEADS.get(len(raw)) or b"\xd8\x2a" + _head(2, len(raw) + 1) + b"\x00") + raw


def pack_links(cids: list[CID]) -> bytes:
    """What `pack` writes for a list of CIDs, assembled as bytes: a popular experience's record lists thousands of
    absorbed adds, and cbor2 encoding each as a tag took 7 ms for the 4,928 of the 1M workload's largest."""
    return _head(4, len(cids)) + b"".join([pack_link(cid) for cid in cids])


def pack_array(items: list[bytes]) -> bytes:
    """What `pack` writes for a list, from the packed forms of its items."""
    return _head(4, len(items)) + b"".join(items)


def unpack(data: bytes) -> Any:
    """Decode what `pack` wrote (trusted local state: no canonical-form check)."""
    return cbor2.loads(data, tag_hook=_tag_hook)
