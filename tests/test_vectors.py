"""Our encoder reproduces, byte for byte, what the IPLD reference codec (@ipld/dag-cbor) produced."""

import json
from pathlib import Path

import pytest

from ledger import codec
from ledger.cid import CID
from ledger.keys import verify_signature
from ledger.ops import decode_block
from ledger.validation import validate
from tests.factories import PARAMS
from tests.vectors.markers import from_marked

HERE = Path(__file__).parent / "vectors"
INPUTS = {entry["name"]: entry for entry in json.loads((HERE / "inputs.json").read_text())}
VECTORS = json.loads((HERE / "vectors.json").read_text())


def test_fixture_covers_every_kind_and_awkward_values():
    assert len(VECTORS) >= 10
    kinds = {INPUTS[v["name"]]["signed"]["kind"] for v in VECTORS}
    assert kinds == {"add", "modify", "delete", "merge", "vote"}
    raw = json.dumps(list(INPUTS.values()), ensure_ascii=False)
    for needle in ('{"/float": 0.5}', '{"/float": 1.0}', '"examples": []', "数学"):
        assert needle in raw


@pytest.mark.parametrize("vector", VECTORS, ids=[v["name"] for v in VECTORS])
def test_encoder_reproduces_reference_bytes_and_cid(vector):
    entry = INPUTS[vector["name"]]
    signed = codec.encode(from_marked(entry["signed"]))
    assert signed.hex() == vector["signed_hex"]
    assert codec.encode(from_marked(entry["unsigned"])).hex() == vector["unsigned_hex"]
    assert str(CID.for_block(signed)) == vector["cid"]


@pytest.mark.parametrize("vector", VECTORS, ids=[v["name"] for v in VECTORS])
def test_reference_bytes_decode_to_valid_signed_operations(vector):
    data = bytes.fromhex(vector["signed_hex"])
    block = validate(data, PARAMS, expected_cid=CID.parse(vector["cid"]))
    unsigned = bytes.fromhex(vector["unsigned_hex"])
    assert block.signing_bytes() == unsigned == block.op.signing_bytes()
    assert verify_signature(block.op.author, unsigned, block.op.signature)
    assert codec.encode(block.op.record()) == data
    assert decode_block(data).cid == block.cid
