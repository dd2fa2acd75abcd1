"""Proofs from the LevelDB Merkle log verify with an independent RFC 9162 verifier and break when altered."""

import hashlib
import random

import pytest

from ledger.keys import AuthorKey
from ledger.merkle import LogAppender, MerkleLog, ProofError, TreeHead, leaf_hash, root_of_leaf_hashes, stored_size
from ledger.proofs import verify_consistency, verify_inclusion
from ledger.store import Store


def mth(entries: list[bytes]) -> bytes:
    """The Merkle Tree Hash of RFC 9162 §2.1.1, straight from its recursive definition."""
    n = len(entries)
    if n == 0:
        return hashlib.sha256(b"").digest()
    if n == 1:
        return hashlib.sha256(b"\x00" + entries[0]).digest()
    k = 1
    while k * 2 < n:
        k *= 2
    return hashlib.sha256(b"\x01" + mth(entries[:k]) + mth(entries[k:])).digest()


LEAVES = 100_000


def entry(i: int) -> bytes:
    return i.to_bytes(4, "big") * 9  # 36 bytes, like a binary CID


@pytest.fixture(scope="module")
def big_log(tmp_path_factory):
    store = Store(tmp_path_factory.mktemp("merkle") / "db", create=True)
    for start in range(0, LEAVES, 10_000):
        txn = store.transaction()
        appender = LogAppender(txn, start)
        for i in range(start, start + 10_000):
            appender.append(entry(i))
        txn.commit()
    yield MerkleLog(store.snapshot(), LEAVES)
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
        assert big_log.root(size) == mth(entries[:size]), size


def test_inclusion_proofs_verify_and_fail_when_altered(big_log):
    rng = random.Random(2)
    for _ in range(300):
        size = rng.randint(1, LEAVES)
        index = rng.randrange(size)
        path, root = big_log.inclusion_path(index, size), big_log.root(size)
        leaf = leaf_hash(entry(index))
        assert verify_inclusion(leaf, index, size, path, root)
        if path:
            assert not verify_inclusion(leaf, index, size, _flip(path, rng), root)
        assert not verify_inclusion(leaf_hash(entry(index + 1)), index, size, path, root)


def test_consistency_proofs_verify_and_fail_when_altered(big_log):
    rng = random.Random(3)
    cases = [(1, 1), (1, 2), (4, 8), (5, 8), (LEAVES, LEAVES), (1, LEAVES)]
    cases += [tuple(sorted((rng.randint(1, LEAVES), rng.randint(1, LEAVES)))) for _ in range(300)]
    for old, new in cases:
        proof = big_log.consistency_path(old, new)
        old_root, new_root = big_log.root(old), big_log.root(new)
        assert verify_consistency(old, new, old_root, new_root, proof), (old, new)
        if proof:
            assert not verify_consistency(old, new, old_root, new_root, _flip(proof, rng))
        if old != new:
            assert not verify_consistency(old, new, big_log.root(old - 1) if old > 1 else b"x" * 32, new_root, proof)


def test_proofs_outside_the_log_are_refused(big_log):
    with pytest.raises(ProofError):
        big_log.inclusion_path(LEAVES, LEAVES)
    with pytest.raises(ProofError):
        big_log.consistency_path(0, 5)
    with pytest.raises(ProofError):
        big_log.consistency_path(5, LEAVES + 1)


def test_start_up_reads_only_the_stored_size(tmp_path):
    store = Store(tmp_path / "db", create=True)
    txn = store.transaction()
    appender = LogAppender(txn, 0)
    for i in range(1000):
        appender.append(entry(i))
    txn.commit()
    root = MerkleLog(store, 1000).root()
    store.close()
    store = Store(tmp_path / "db", create=False)
    reopened = MerkleLog(store, stored_size(store))
    assert (reopened.size, reopened.root()) == (1000, root)
    store.close()


def test_the_root_from_leaves_alone_equals_the_stored_tree(big_log):
    for size in (0, 1, 5, 1000, 4097):
        assert root_of_leaf_hashes(big_log.leaf_hash(i) for i in range(size)) == big_log.root(size)


def test_verifiers_refuse_indexes_and_sizes_out_of_range(big_log):
    leaf, path, root = big_log.leaf_hash(3), big_log.inclusion_path(3, 8), big_log.root(8)
    assert verify_inclusion(leaf, 3, 8, path, root)
    assert not verify_inclusion(leaf, -5, 8, path, root) and not verify_inclusion(leaf, 8, 8, path, root)
    proof = big_log.consistency_path(3, 8)
    assert not verify_consistency(-3, 8, big_log.root(3), root, proof)
    assert not verify_consistency(9, 8, big_log.root(3), root, proof)


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
    old = ledger.view().tree_head()
    ledger.ingest([b.data for b in blocks[25:]])
    view = ledger.view()
    head = view.tree_head()
    assert head.verify() and head.node == ledger.node_key.did and head.size == view.log_size
    for block in blocks[::7]:
        proof = view.inclusion_proof(block.cid)
        leaf = bytes.fromhex(proof["leaf_hash"])
        assert leaf == leaf_hash(block.cid.raw)
        path = [bytes.fromhex(h) for h in proof["audit_path"]]
        assert verify_inclusion(leaf, proof["leaf_index"], proof["tree_size"], path, head.root)
    consistency = view.consistency_proof(old.size)
    assert verify_consistency(
        old.size, head.size, old.root, head.root, [bytes.fromhex(h) for h in consistency["proof"]]
    )
    with pytest.raises(ProofError):
        view.inclusion_proof(CID.for_block(b"never logged"))
    ledger.close()
