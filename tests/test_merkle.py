"""Proofs from the LevelDB Merkle log verify with an independent RFC 9162 verifier and break when altered."""

import random

import pytest

from ledger.keys import AuthorKey
from ledger.merkle import MerkleLog, ProofError, TreeHead
from ledger.store import Store
from tests import rfc9162 as rfc

LEAVES = 100_000


def entry(i: int) -> bytes:
    return i.to_bytes(4, "big") * 9  # 36 bytes, like a binary CID


@pytest.fixture(scope="module")
def big_log(tmp_path_factory):
    store = Store(tmp_path_factory.mktemp("merkle") / "db", create=True)
    log = MerkleLog(store)
    for start in range(0, LEAVES, 10_000):
        txn = store.transaction()
        for i in range(start, start + 10_000):
            log.append(txn, entry(i))
        txn.commit()
    yield log
    store.close()


def _flip(proof: list[bytes], rng: random.Random) -> list[bytes]:
    altered = list(proof)
    index = rng.randrange(len(altered))
    byte = rng.randrange(32)
    altered[index] = altered[index][:byte] + bytes([altered[index][byte] ^ 1]) + altered[index][byte + 1 :]
    return altered


def test_roots_equal_the_rfc_merkle_tree_hash(big_log):
    entries = [entry(i) for i in range(LEAVES)]
    rng = random.Random(1)
    for size in [0, 1, 2, 3, 7, 8, 9, 1023, 1024, 1025, LEAVES, *rng.sample(range(LEAVES), 5)]:
        assert big_log.root(size) == rfc.mth(entries[:size]), size


def test_inclusion_proofs_verify_and_fail_when_altered(big_log):
    rng = random.Random(2)
    for _ in range(300):
        size = rng.randint(1, LEAVES)
        index = rng.randrange(size)
        path, root = big_log.inclusion_path(index, size), big_log.root(size)
        leaf = rfc.leaf_hash(entry(index))
        assert rfc.verify_inclusion(leaf, index, size, path, root)
        if path:
            assert not rfc.verify_inclusion(leaf, index, size, _flip(path, rng), root)
        assert not rfc.verify_inclusion(rfc.leaf_hash(entry(index + 1)), index, size, path, root)


def test_consistency_proofs_verify_and_fail_when_altered(big_log):
    rng = random.Random(3)
    cases = [(1, 1), (1, 2), (4, 8), (5, 8), (LEAVES, LEAVES), (1, LEAVES)]
    cases += [tuple(sorted((rng.randint(1, LEAVES), rng.randint(1, LEAVES)))) for _ in range(300)]
    for old, new in cases:
        proof = big_log.consistency_path(old, new)
        old_root, new_root = big_log.root(old), big_log.root(new)
        assert rfc.verify_consistency(old, new, old_root, new_root, proof), (old, new)
        if proof:
            assert not rfc.verify_consistency(old, new, old_root, new_root, _flip(proof, rng))
        if old != new:
            assert not rfc.verify_consistency(
                old, new, big_log.root(old - 1) if old > 1 else b"x" * 32, new_root, proof
            )


def test_proofs_outside_the_log_are_refused(big_log):
    with pytest.raises(ProofError):
        big_log.inclusion_path(LEAVES, LEAVES)
    with pytest.raises(ProofError):
        big_log.consistency_path(0, 5)
    with pytest.raises(ProofError):
        big_log.consistency_path(5, LEAVES + 1)


def test_start_up_reads_only_the_stored_size(tmp_path):
    store = Store(tmp_path / "db", create=True)
    log = MerkleLog(store)
    txn = store.transaction()
    for i in range(1000):
        log.append(txn, entry(i))
    txn.commit()
    root = log.root()
    store.close()
    store = Store(tmp_path / "db", create=False)
    reopened = MerkleLog(store)
    assert (reopened.size, reopened.root()) == (1000, root)
    store.close()


def test_signed_tree_heads_verify_and_detect_tampering():
    key = AuthorKey(bytes([5]) * 32)
    head = TreeHead.sign(10, b"\x01" * 32, key, timestamp=1_700_000_000_000)
    assert head.verify() and head.node == key.did
    assert not TreeHead(11, head.root, head.timestamp, head.node, head.signature).verify()
    assert not TreeHead(10, b"\x02" * 32, head.timestamp, head.node, head.signature).verify()
    assert not TreeHead(10, head.root, head.timestamp, "did:key:zBad", head.signature).verify()
    assert head.to_json()["root"] == "01" * 32


def test_the_ledger_serves_signed_heads_and_proofs_by_cid(tmp_path):
    import random as _random

    from ledger.cid import CID
    from tests.ledgers import open_ledger, random_history

    ledger = open_ledger(tmp_path / "n")
    blocks = random_history(_random.Random(9), 40)
    ledger.ingest([b.data for b in blocks[:25]])
    old = ledger.tree_head()
    ledger.ingest([b.data for b in blocks[25:]])
    head = ledger.tree_head()
    assert head.verify() and head.node == ledger.node_key.did and head.size == ledger.log_size
    for block in blocks[::7]:
        proof = ledger.inclusion_proof(block.cid)
        leaf = bytes.fromhex(proof["leaf_hash"])
        assert leaf == rfc.leaf_hash(block.cid.raw)
        path = [bytes.fromhex(h) for h in proof["audit_path"]]
        assert rfc.verify_inclusion(leaf, proof["leaf_index"], proof["tree_size"], path, head.root)
    consistency = ledger.consistency_proof(old.size)
    assert rfc.verify_consistency(
        old.size, head.size, old.root, head.root, [bytes.fromhex(h) for h in consistency["proof"]]
    )
    with pytest.raises(ProofError):
        ledger.inclusion_proof(CID.for_block(b"never logged"))
    ledger.close()
