"""Content identifiers: CIDv1, codec dag-cbor, hash sha2-256 — the only kind of link in the ledger."""

from __future__ import annotations

import base64
import hashlib

from ledger.errors import LedgerError

DAG_CBOR_CODEC = 0x71
SHA2_256_CODE = 0x12
#: version 1, codec dag-cbor, multihash sha2-256 with a 32-byte digest
_PREFIX = bytes([0x01, DAG_CBOR_CODEC, SHA2_256_CODE, 0x20])
CID_LENGTH = len(_PREFIX) + 32  # bytes in a binary CID
_BASE32_LENGTH = 1 + (CID_LENGTH * 8 + 4) // 5  # characters of the canonical form: "b" and unpadded base32
_BASE32_PADDING = "=" * (-(_BASE32_LENGTH - 1) % 8)


class CIDError(LedgerError):
    """A string or byte form that is not a dag-cbor/sha2-256 CIDv1."""


class CID:
    """An immutable CIDv1 (dag-cbor, sha2-256); orders by its binary form so sorted lists are canonical."""

    __slots__ = ("raw",)

    raw: bytes

    def __init__(self, raw: bytes) -> None:
        if len(raw) != CID_LENGTH or not raw.startswith(_PREFIX):
            raise CIDError("cid.invalid", f"not a CIDv1 dag-cbor sha2-256 link: {bytes(raw[:8]).hex()}…")
        object.__setattr__(self, "raw", bytes(raw))

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("CID is immutable")

    @classmethod
    def for_block(cls, data: bytes) -> CID:
        """The CID of DAG-CBOR bytes."""
        return cls(_PREFIX + hashlib.sha256(data).digest())

    @classmethod
    def parse(cls, text: str, field: str = "cid") -> CID:
        """Parse any multibase form of a CID (base32 `bafyrei…` is canonical); reject other codecs and hashes.

        The canonical form is decoded here directly: multiformats' general decoder checks its own types at run time
        and costs ~1 ms a CID, which dominated a `get` of a long list and the crash test's checks."""
        text = text.strip()
        if len(text) == _BASE32_LENGTH and text.startswith("b") and text.islower():
            try:
                raw = base64.b32decode(text[1:].upper() + _BASE32_PADDING)
            except ValueError:
                raw = b""
            if raw.startswith(_PREFIX) and str(cls(raw)) == text:
                return cls(raw)
        from multiformats import CID as ParsedCID  # loaded for the other forms only (~40 ms of a command's start)

        try:
            parsed = ParsedCID.decode(text)
        except Exception as exc:  # multiformats raises several unrelated types for bad input
            raise CIDError("cid.invalid", f"{field}: {text!r} is not a CID ({exc})") from None
        if parsed.version != 1 or parsed.codec.code != DAG_CBOR_CODEC or parsed.hashfun.code != SHA2_256_CODE:
            raise CIDError(
                "cid.invalid",
                f"{field}: {text!r} must be a CIDv1 with codec dag-cbor and hash sha2-256, "
                f"got v{parsed.version} {parsed.codec.name} {parsed.hashfun.name}",
            )
        return cls(bytes(parsed))

    def __str__(self) -> str:
        return "b" + base64.b32encode(self.raw).decode("ascii").lower().rstrip("=")

    def __repr__(self) -> str:
        return f"CID({self})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CID) and self.raw == other.raw

    def __lt__(self, other: CID) -> bool:
        return self.raw < other.raw

    def __hash__(self) -> int:
        return hash(self.raw)
