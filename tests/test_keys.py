"""did:key identifiers and key files that stay private."""

import json
import os
import stat
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from multiformats import multibase

from ledger.keys import (
    MAX_KEY_FILE_BYTES,
    AuthorKey,
    IdentityError,
    did_from_public_key,
    public_key_from_did,
    verify_signature,
)


def test_did_key_is_multicodec_ed25519_in_base58btc():
    key = AuthorKey(bytes(32))
    assert key.did.startswith("did:key:z6Mk")
    raw = multibase.decode(key.did.removeprefix("did:key:"))
    assert raw[:2] == b"\xed\x01"
    assert public_key_from_did(key.did) == raw[2:]
    assert did_from_public_key(raw[2:]) == key.did


@given(public_key=st.binary(min_size=32, max_size=32))
def test_a_did_key_is_what_multiformats_encodes(public_key):
    """The did:key made here is multiformats' base58btc of the same bytes, for any 32-byte key (zeros included)."""
    assert did_from_public_key(public_key) == "did:key:" + multibase.encode(b"\xed\x01" + public_key, "base58btc")


def test_known_did_key_vector():
    # W3C did:key test vector (Ed25519): this did:key encodes this public key
    did = "did:key:z6MkiTBz1ymuepAQ4HEHYSF1H8quG5GLVVQR3djdX3mDooWp"
    public = public_key_from_did(did)
    assert did_from_public_key(public) == did


@pytest.mark.parametrize(
    "did",
    [
        "did:web:example.com",
        "did:key:f6Mk",  # not base58btc
        "did:key:z0OIl",  # not in the base58 alphabet
        "did:key:zQ3shokFTS3brHcDQrn82RUDfCZESWL1ZdCEJwekUDPQiYBme",  # secp256k1, not Ed25519
        "",
    ],
)
def test_bad_did_is_rejected_with_a_code(did):
    with pytest.raises(IdentityError) as caught:
        public_key_from_did(did)
    assert caught.value.code == "author.did"


def test_signatures_verify_only_for_the_same_key_and_message():
    key = AuthorKey(bytes([7]) * 32)
    signature = key.sign(b"message")
    assert verify_signature(key.did, b"message", signature)
    assert not verify_signature(key.did, b"messagf", signature)
    assert not verify_signature(AuthorKey(bytes([8]) * 32).did, b"message", signature)
    assert not verify_signature(key.did, b"message", signature[:-1])


def test_key_file_is_created_0600_and_loads_back(tmp_path):
    path = tmp_path / "author.key"
    key = AuthorKey.generate()
    key.save(path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert AuthorKey.load(path).did == key.did


def test_key_file_is_never_overwritten(tmp_path):
    path = tmp_path / "author.key"
    AuthorKey.generate().save(path)
    before = path.read_bytes()
    with pytest.raises(IdentityError) as caught:
        AuthorKey.generate().save(path)
    assert caught.value.code == "keyfile.exists"
    assert path.read_bytes() == before


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o644, 0o660])
def test_readable_key_file_is_refused(tmp_path, mode):
    path = tmp_path / "author.key"
    AuthorKey.generate().save(path)
    os.chmod(path, mode)
    with pytest.raises(IdentityError) as caught:
        AuthorKey.load(path)
    assert caught.value.code == "keyfile.permissions"
    assert "chmod 600" in caught.value.message


@pytest.mark.parametrize(
    "content",
    [
        "",
        "not json",
        json.dumps({"type": "rsa", "seed": "00" * 32}),
        json.dumps({"type": "ed25519-seed", "seed": "zz"}),
        json.dumps({"type": "ed25519-seed", "seed": "00" * 32, "did": AuthorKey(bytes([1]) * 32).did}),
    ],
)
def test_damaged_key_file_is_refused(tmp_path, content):
    path = tmp_path / "author.key"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, content.encode())
    os.close(fd)
    with pytest.raises(IdentityError) as caught:
        AuthorKey.load(path)
    assert caught.value.code == "keyfile.format"


def test_missing_key_file_is_an_io_error(tmp_path):
    with pytest.raises(IdentityError) as caught:
        AuthorKey.load(tmp_path / "absent.key")
    assert caught.value.code == "keyfile.io"


def _private_file(path, content: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, content)
    os.close(fd)


def test_a_binary_key_file_is_refused_by_name(tmp_path):
    path = tmp_path / "author.key"
    _private_file(path, b'{"type": "ed25519-seed", "seed": "\xff\xfe"}')
    with pytest.raises(IdentityError) as caught:
        AuthorKey.load(path)
    assert caught.value.code == "keyfile.format"
    assert str(path) in caught.value.message and "0xff" in caught.value.message


def test_a_huge_key_file_is_refused_after_a_bounded_read(tmp_path):
    """A sparse 64 GiB file: reading it whole would need 64 GiB of memory; the load reads MAX_KEY_FILE_BYTES + 1."""
    path = tmp_path / "author.key"
    _private_file(path, b"")
    os.truncate(path, 64 << 30)
    with pytest.raises(IdentityError) as caught:
        AuthorKey.load(path)
    assert caught.value.code == "keyfile.format"
    assert f"larger than {MAX_KEY_FILE_BYTES} bytes" in caught.value.message and str(path) in caught.value.message


def test_a_shared_device_is_refused_before_it_is_read():
    with pytest.raises(IdentityError) as caught:
        AuthorKey.load(Path("/dev/zero"))
    assert caught.value.code == "keyfile.permissions"
