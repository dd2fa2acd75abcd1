"""Ed25519 author keys, `did:key` identifiers, and key files that stay private (mode 0600)."""

from __future__ import annotations

import json
import os
import stat
from functools import lru_cache
from pathlib import Path

import nacl.exceptions
import nacl.signing

from ledger.errors import LedgerError

_ED25519_PUB_MULTICODEC = b"\xed\x01"
_DID_PREFIX = "did:key:z"
_DID_MAX_LENGTH = 64  # an Ed25519 did:key has 56 characters; refuse long input before decoding it
_KEY_FILE_TYPE = "ed25519-seed"
SIGNATURE_LENGTH = 64
#: a key file holds ~150 bytes of JSON; a larger file is refused unread
MAX_KEY_FILE_BYTES = 4096


class IdentityError(LedgerError):
    """A bad did:key, key file or signature input."""


_BASE58BTC = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"


def did_from_public_key(public_key: bytes) -> str:
    """did:key of an Ed25519 public key: multicodec ed25519-pub, multibase base58btc (`did:key:z6Mk…`).

    Base58btc is encoded here (the two bytes of the multicodec are not zero, so there are no leading zeros to
    keep): multiformats' encoder took ~0.25 ms per key, twice for each ledger opened."""
    number = int.from_bytes(_ED25519_PUB_MULTICODEC + public_key, "big")
    digits = []
    while number:
        number, digit = divmod(number, 58)
        digits.append(_BASE58BTC[digit])
    return _DID_PREFIX + "".join(reversed(digits))


@lru_cache(maxsize=65536)
def _verify_key(did: str) -> nacl.signing.VerifyKey:
    if not did.startswith(_DID_PREFIX) or len(did) > _DID_MAX_LENGTH:
        raise IdentityError("author.did", f"author: {did[:40]!r} is not a base58btc did:key (did:key:z…)")
    from multiformats import multibase

    try:
        raw = multibase.decode(did[len("did:key:") :])
    except Exception:  # multibase raises several types for bad alphabets
        raise IdentityError("author.did", f"author: {did[:60]!r} is not valid base58btc") from None
    if len(raw) != 34 or not raw.startswith(_ED25519_PUB_MULTICODEC):
        raise IdentityError("author.did", f"author: {did[:60]!r} is not an Ed25519 did:key (multicodec 0xed)")
    try:
        return nacl.signing.VerifyKey(raw[2:])
    except Exception:
        raise IdentityError("author.did", f"author: {did[:60]!r} holds no valid Ed25519 point") from None


def public_key_from_did(did: str) -> bytes:
    """The 32-byte Ed25519 public key inside a did:key; raises IdentityError('author.did') if it is not one."""
    return bytes(_verify_key(did))


def verify_signature(did: str, message: bytes, signature: bytes) -> bool:
    """True when `signature` is the author's Ed25519 signature of `message`."""
    verify_key = _verify_key(did)
    if len(signature) != SIGNATURE_LENGTH:
        return False
    try:
        verify_key.verify(message, signature)
    except nacl.exceptions.BadSignatureError:
        return False
    return True


class AuthorKey:
    """An Ed25519 signing key and its did:key."""

    def __init__(self, seed: bytes) -> None:
        self._signing_key = nacl.signing.SigningKey(seed)
        self.did = did_from_public_key(bytes(self._signing_key.verify_key))

    @classmethod
    def generate(cls) -> AuthorKey:
        return cls(os.urandom(32))

    @property
    def seed(self) -> bytes:
        return bytes(self._signing_key)

    def sign(self, message: bytes) -> bytes:
        return self._signing_key.sign(message).signature

    def save(self, path: Path) -> None:
        """Write the key to a new file created 0600, atomically; never overwrite an existing key."""
        path = Path(path)
        body = json.dumps({"type": _KEY_FILE_TYPE, "seed": self.seed.hex(), "did": self.did}) + "\n"
        if path.exists():
            raise IdentityError("keyfile.exists", f"{path}: already exists; refusing to overwrite a key")
        temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as handle:
                handle.write(body)
                handle.flush()
                os.fsync(handle.fileno())
            os.link(temporary, path)  # fails if the name appeared meanwhile: no overwrite, no half-written key
        except FileExistsError:
            raise IdentityError("keyfile.exists", f"{path}: already exists; refusing to overwrite a key") from None
        except OSError as exc:
            raise IdentityError("keyfile.io", f"{path}: cannot create ({exc.strerror})") from None
        finally:
            temporary.unlink(missing_ok=True)

    @classmethod
    def load(cls, path: Path) -> AuthorKey:
        """Read a key file; refuse one that group or others can read, or whose did does not match its seed.

        The mode is checked on the open file before anything is read, and at most MAX_KEY_FILE_BYTES + 1
        bytes are read: a key file is ~150 bytes, so a device or a huge file is refused, not slurped.
        """
        try:
            with open(path, "rb") as handle:
                mode = os.fstat(handle.fileno()).st_mode
                if mode & (stat.S_IRWXG | stat.S_IRWXO):
                    raise IdentityError(
                        "keyfile.permissions",
                        f"{path}: mode {stat.S_IMODE(mode):04o} lets others read the key; run chmod 600 {path}",
                    )
                data = handle.read(MAX_KEY_FILE_BYTES + 1)
        except OSError as exc:
            raise IdentityError("keyfile.io", f"{path}: cannot read ({exc.strerror})") from None
        if len(data) > MAX_KEY_FILE_BYTES:
            raise IdentityError(
                "keyfile.format", f"{path}: larger than {MAX_KEY_FILE_BYTES} bytes; not an {_KEY_FILE_TYPE} key file"
            )
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise IdentityError(
                "keyfile.format",
                f"{path}: not an {_KEY_FILE_TYPE} key file (binary data: byte 0x{data[exc.start]:02x} at {exc.start} "
                "is not UTF-8 text)",
            ) from None
        try:
            record = json.loads(text)
            if record["type"] != _KEY_FILE_TYPE:
                raise ValueError(f"type {record['type']!r}")
            key = cls(bytes.fromhex(record["seed"]))
        except Exception as exc:
            raise IdentityError("keyfile.format", f"{path}: not an {_KEY_FILE_TYPE} key file ({exc})") from None
        if record.get("did") != key.did:
            raise IdentityError("keyfile.format", f"{path}: its did does not match its seed (file damaged?)")
        return key
