"""The p2p layer's pure parts, in process: the Merkle frontier a reader keeps per log, the orphan pool's bounds,
the decoding of gossip messages and sync requests (stable codes for anything a peer can send), and the outbox
that batches operations into gossip messages."""

from __future__ import annotations

import hashlib
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import cbor2
import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from libp2p.peer.id import ID
from trio.testing import MockClock

from ledger import codec
from ledger.cid import CID, CID_LENGTH
from ledger.errors import LedgerError
from ledger.merkle import Frontier, LogAppender, MerkleLog, ProofError, leaf_hash, root_of_leaf_hashes
from ledger.store import Store
from p2p import fetch, gossip, orphans
from p2p.counters import Counters
from p2p.discovery import MAX_KNOWN, AddressBook, check_addrs, decode_message
from p2p.fetch import FETCH_WINDOW, PEER_CHUNKS, Fetcher
from p2p.gossip import GossipBatch, GossipError, Outbox
from p2p.host import key_pair, reaches_listener, tcp_endpoint
from p2p.orphans import Orphan, OrphanPool
from p2p.peers import Peer
from p2p.reconcile import decode_item, encode_item
from p2p.sync import MAX_BLOCKS, SyncError, _request
from tests import factories as f

# --- the Merkle frontier ------------------------------------------------------------------------------

LEAVES = 1100  # past 1024, so sizes on both sides of a power of two are covered


def entry(i: int) -> bytes:
    return hashlib.sha256(i.to_bytes(4, "big")).digest()


def mth(hashes: list[bytes]) -> bytes:
    """RFC 9162 §2.1.1 straight from its recursive definition, over leaf hashes."""
    if not hashes:
        return hashlib.sha256(b"").digest()
    if len(hashes) == 1:
        return hashes[0]
    k = 1
    while k * 2 < len(hashes):
        k *= 2
    return hashlib.sha256(b"\x01" + mth(hashes[:k]) + mth(hashes[k:])).digest()


@pytest.fixture(scope="module")
def stored_log(tmp_path_factory):
    """The same leaves written by the ledger's own log appender (stored inner nodes)."""
    store = Store(tmp_path_factory.mktemp("frontier") / "db", create=True)
    txn = store.transaction()
    appender = LogAppender(txn, 0)
    for i in range(LEAVES):
        appender.append(entry(i))
    txn.commit()
    yield MerkleLog(store.snapshot(), LEAVES)
    store.close()


LEAF_HASHES = [leaf_hash(entry(i)) for i in range(LEAVES)]


def test_a_frontier_has_the_stored_logs_root_at_every_size(stored_log):
    frontier = Frontier()
    assert frontier.root() == stored_log.root(0) == mth([])
    for size in range(1, LEAVES + 1):
        frontier.append(LEAF_HASHES[size - 1])
        assert frontier.size == size
        assert frontier.root() == stored_log.root(size), size
    assert root_of_leaf_hashes(LEAF_HASHES) == stored_log.root()
    for size in (1, 2, 3, 5, 7, 8, 9, 63, 64, 65, 100):
        assert root_of_leaf_hashes(LEAF_HASHES[:size]) == mth(LEAF_HASHES[:size]), size


def test_a_frontiers_subtrees_are_the_perfect_subtrees_of_its_size():
    """The compact range of size n: one perfect subtree per set bit of n, largest (leftmost) first."""
    for size in (0, 1, 2, 3, 6, 7, 8, 13, 64, 100, 1023):
        frontier = Frontier()
        for leaf in LEAF_HASHES[:size]:
            frontier.append(leaf)
        expected, start = [], 0
        for bit in range(size.bit_length() - 1, -1, -1):
            if size >> bit & 1:
                expected.append(mth(LEAF_HASHES[start : start + (1 << bit)]))
                start += 1 << bit
        assert frontier.subtrees == expected, size


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_frontier_restored_from_its_size_and_subtrees_goes_on_like_the_original(stored_log, data):
    size = data.draw(st.integers(0, LEAVES), label="size")
    cut = data.draw(st.integers(0, size), label="restored at")
    original = Frontier()
    for leaf in LEAF_HASHES[:cut]:
        original.append(leaf)
    restored = Frontier(cut, list(original.subtrees))  # as LogState.decode does from a saved position
    assert restored.root() == original.root() == stored_log.root(cut)
    copy = restored.copy()
    step = data.draw(st.integers(1, 97), label="check every")
    for position in range(cut, size):
        restored.append(LEAF_HASHES[position])
        if (position + 1 - cut) % step == 0 or position + 1 == size:
            assert restored.root() == stored_log.root(position + 1), position + 1
    assert restored.size == size
    assert copy.size == cut and copy.root() == stored_log.root(cut)  # a copy does not share the original's stack


@pytest.mark.parametrize(("size", "count"), [(0, 1), (1, 0), (3, 1), (3, 3), (8, 2), (1024, 0)])
def test_a_frontier_with_the_wrong_number_of_subtrees_is_refused(size, count):
    with pytest.raises(ProofError) as caught:
        Frontier(size, [b"\x00" * 32] * count)
    assert caught.value.code == "proof.frontier"


# --- the orphan pool ----------------------------------------------------------------------------------

CAPS = {"MAX_PER_PEER": 3, "MAX_PER_AUTHOR": 4, "MAX_TOTAL": 6}


@pytest.fixture
def small_caps(monkeypatch):
    for name, value in CAPS.items():
        monkeypatch.setattr(orphans, name, value)


def orphan(number: int, peer: str = "p", author: str = "a", missing: tuple[int, ...] = (0,), at: float = 0.0):
    return Orphan(
        cid=b"c%d" % number,
        data=b"op %d" % number,
        missing={b"d%d" % d for d in missing},
        author=author,
        peer=peer,
        source="gossip",
        arrived=at or float(number),
    )


def cids(pool: OrphanPool) -> list[bytes]:
    return [cid for cid in (b"c%d" % n for n in range(100)) if cid in pool]


def test_a_full_peer_share_evicts_that_peers_oldest(small_caps):
    pool = OrphanPool()
    pool.add(orphan(1, peer="p", missing=(1,)))
    pool.add(orphan(2, peer="q"))
    pool.add(orphan(3, peer="p"))
    pool.add(orphan(4, peer="p"))
    pool.add(orphan(5, peer="p"))  # p holds 3 already: its oldest (1) goes, q's older one stays
    assert cids(pool) == [b"c2", b"c3", b"c4", b"c5"]
    assert pool.evicted == 1
    assert pool.missing_from("p") == [b"d0"]  # nothing waits for d1 any more


def test_a_full_author_share_evicts_that_authors_oldest(small_caps):
    pool = OrphanPool()
    for number, peer in zip(range(1, 6), "pqrst", strict=True):
        pool.add(orphan(number, peer=peer, author="a" if number != 2 else "b"))
    pool.add(orphan(6, peer="u", author="a"))  # a has 4 (1, 3, 4, 5): 1 goes
    assert cids(pool) == [b"c2", b"c3", b"c4", b"c5", b"c6"]
    assert pool.evicted == 1


def test_a_full_pool_evicts_its_oldest(small_caps):
    pool = OrphanPool()
    for number in range(1, 8):
        pool.add(orphan(number, peer=f"p{number}", author=f"a{number}"))
    assert len(pool) == 6 and cids(pool) == [b"c%d" % n for n in range(2, 8)]
    assert pool.evicted == 1


def test_an_orphan_already_waiting_is_not_added_twice(small_caps):
    pool = OrphanPool()
    pool.add(orphan(1, missing=(1,)))
    pool.add(orphan(1, peer="other", missing=(2,)))
    assert len(pool) == 1 and pool.missing_from("p") == [b"d1"] and pool.missing_from("other") == []


def test_release_waits_for_every_dependency_and_keeps_arrival_order():
    pool = OrphanPool()
    pool.add(orphan(1, missing=(1, 2), at=5.0))
    pool.add(orphan(2, missing=(2,), at=3.0))
    pool.add(orphan(3, missing=(3,), at=4.0))
    assert pool.release([b"d1"]) == []
    assert pool.missing_from("p") == [b"d2", b"d3"]
    released = pool.release([b"d3", b"d2", b"d9"])
    assert [o.cid for o in released] == [b"c2", b"c3", b"c1"]  # by arrival, not by the order of `stored`
    assert len(pool) == 0 and pool.missing_from("p") == []
    assert pool.release([b"d1", b"d2"]) == []


def test_what_to_ask_for_leaves_out_dependencies_waiting_here():
    """A chain c2 -> c1 -> d9: c1 is here (waiting too), so only d9 is worth asking the peer for."""
    pool = OrphanPool()
    pool.add(Orphan(b"c1", b"op 1", {b"d9"}, "a", "p", "sync", 1.0))
    pool.add(Orphan(b"c2", b"op 2", {b"c1"}, "a", "p", "sync", 2.0))
    assert pool.missing_from("p") == [b"d9"]


def test_a_chain_of_orphans_is_released_at_once():
    """c3 -> c2 -> c1 -> d9, and c4 also needs d8: d9 stored releases the chain in one go, c4 stays."""
    pool = OrphanPool()
    pool.add(Orphan(b"c1", b"op 1", {b"d9"}, "a", "p", "gossip", 1.0))
    pool.add(Orphan(b"c3", b"op 3", {b"c2"}, "a", "p", "gossip", 2.0))
    pool.add(Orphan(b"c2", b"op 2", {b"c1"}, "a", "p", "gossip", 3.0))
    pool.add(Orphan(b"c4", b"op 4", {b"c3", b"d8"}, "a", "p", "gossip", 4.0))
    assert [o.cid for o in pool.release([b"d9"])] == [b"c1", b"c3", b"c2"]  # in arrival order
    assert len(pool) == 1 and pool.missing_from("p") == [b"d8"]


def test_an_orphan_taken_back_leaves_no_trace():
    pool = OrphanPool()
    pool.add(orphan(1, missing=(1, 2)))
    taken = pool.take(b"c1")
    assert taken is not None and taken.cid == b"c1"
    assert len(pool) == 0 and pool.missing_from("p") == [] and pool.release([b"d1", b"d2"]) == []
    assert pool.take(b"c1") is None and pool.evicted == 0


def test_orphans_older_than_the_ttl_expire():
    pool = OrphanPool()
    for number in range(1, 5):
        pool.add(orphan(number, at=100.0 * number))
    assert pool.expire(now=orphans.TTL + 250.0) == 2  # arrived at 100 and 200: older than now - TTL (250)
    assert cids(pool) == [b"c3", b"c4"] and pool.expired == 2
    assert pool.expire(now=orphans.TTL + 250.0) == 0
    assert pool.release([b"d0"]) and len(pool) == 0


@dataclass
class Model:
    """The pool's documented behaviour, written plainly: a list in arrival order."""

    waiting: list[Orphan] = field(default_factory=list)

    def add(self, new: Orphan) -> None:
        if any(o.cid == new.cid for o in self.waiting):
            return
        for matches, cap in (
            (lambda o: o.peer == new.peer, CAPS["MAX_PER_PEER"]),
            (lambda o: o.author == new.author, CAPS["MAX_PER_AUTHOR"]),
            (lambda o: True, CAPS["MAX_TOTAL"]),
        ):
            share = [o for o in self.waiting if matches(o)]
            if len(share) >= cap:
                self.waiting.remove(share[0])
        self.waiting.append(new)

    def release(self, stored: list[bytes]) -> list[bytes]:
        ready = [o for o in self.waiting if o.missing <= set(stored)]
        self.waiting = [o for o in self.waiting if o not in ready]
        for o in self.waiting:
            o.missing -= set(stored)
        return [o.cid for o in ready]

    def expire(self, now: float) -> None:
        self.waiting = [o for o in self.waiting if o.arrived >= now - orphans.TTL]


def check_consistent(pool: OrphanPool, model: Model) -> None:
    """Caps hold; the pool holds what the model holds; every index describes exactly the orphans held."""
    held = list(pool._orphans.values())
    assert [o.cid for o in held] == [o.cid for o in model.waiting]
    assert [o.missing for o in held] == [o.missing for o in model.waiting]
    assert len(held) <= CAPS["MAX_TOTAL"]
    for index, key, cap in ((pool._by_peer, "peer", "MAX_PER_PEER"), (pool._by_author, "author", "MAX_PER_AUTHOR")):
        expected: dict[str, list[bytes]] = {}
        for o in held:
            expected.setdefault(getattr(o, key), []).append(o.cid)
        assert {k: list(v) for k, v in index.items()} == expected, key  # oldest first, no empty entries
        assert all(len(v) <= CAPS[cap] for v in expected.values())
    waiting: dict[bytes, set[bytes]] = {}
    for o in held:
        for dependency in o.missing:
            waiting.setdefault(dependency, set()).add(o.cid)
    assert dict(pool._waiting) == waiting
    for peer in {o.peer for o in held} | {"nobody"}:
        assert pool.missing_from(peer) == sorted({d for o in held if o.peer == peer for d in o.missing})


actions = st.lists(
    st.one_of(
        st.tuples(
            st.just("add"),
            st.integers(0, 14),  # cid: some come back after eviction or release
            st.sampled_from("pqr"),
            st.sampled_from("abc"),
            st.sets(st.integers(0, 5), min_size=1, max_size=3),
        ),
        st.tuples(st.just("release"), st.lists(st.integers(0, 6), max_size=3)),
        st.tuples(st.just("expire"), st.integers(0, 40)),
    ),
    max_size=60,
)


@settings(max_examples=400, deadline=None)
@given(actions=actions)
def test_the_pool_stays_within_its_caps_and_its_indexes_agree(actions):
    with pytest.MonkeyPatch.context() as patch:
        for name, value in CAPS.items():
            patch.setattr(orphans, name, value)
        pool, model, clock = OrphanPool(), Model(), 0.0
        for action in actions:
            clock += 1.0
            if action[0] == "add":
                _, number, peer, author, missing = action
                for target in (pool, model):
                    target.add(orphan(number, peer, author, tuple(missing), at=clock))  # one object each
            elif action[0] == "release":
                stored = [b"d%d" % d for d in action[1]]
                released = pool.release(stored)
                assert [o.cid for o in released] == model.release(stored)
                assert all(not o.missing for o in released)
                assert [o.arrived for o in released] == sorted(o.arrived for o in released)
            else:
                now = clock - orphans.TTL + action[1] * 0.5  # somewhere among the recent arrivals
                pool.expire(now=now)
                model.expire(now)
            check_consistent(pool, model)


# --- gossip messages ----------------------------------------------------------------------------------

NODE = f.author(1).did
OP = f.add().data


def _gossip_code(data: bytes) -> str:
    with pytest.raises(GossipError) as caught:
        GossipBatch.decode(data)
    return caught.value.code


def test_a_batch_round_trips():
    batch = GossipBatch((OP, f.add(f.SEED_TEXTS[1]).data), NODE, 7)
    assert GossipBatch.decode(batch.encode()) == batch


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=300))
def test_garbage_is_refused_with_a_stable_code(data):
    try:
        GossipBatch.decode(data)
    except GossipError as exc:
        assert exc.code in {"gossip.codec", "gossip.schema", "gossip.ops", "gossip.node", "gossip.size"}
    else:
        pytest.fail("garbage decoded as a batch")


@settings(max_examples=300, deadline=None)
@given(
    value=st.recursive(
        st.none() | st.booleans() | st.integers(-(2**64), 2**64 - 1) | st.text(max_size=10) | st.binary(max_size=10),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
        max_leaves=12,
    )
)
def test_any_canonical_value_that_is_not_a_batch_is_refused_with_a_stable_code(value):
    try:
        data = codec.encode(value)
    except codec.EncodeError:
        return
    assert _gossip_code(data) in {"gossip.schema", "gossip.ops", "gossip.node", "gossip.size"}


def _cbor_in_order(keys: list[str], values: dict) -> bytes:
    """A map written in the given key order (cbor2 keeps insertion order unless asked to sort)."""
    return cbor2.dumps({key: values[key] for key in keys})


def test_non_canonical_cbor_is_refused():
    fields = {"ops": [OP], "node": NODE, "size": 5}
    canonical = GossipBatch((OP,), NODE, 5).encode()
    assert _cbor_in_order(["ops", "node", "size"], fields) == canonical  # the DAG-CBOR order
    unsorted = _cbor_in_order(["size", "node", "ops"], fields)
    long_size = canonical[:-1] + b"\x1a\x00\x00\x00\x05"  # 5 as a 4-byte integer
    assert canonical.endswith(b"\x05")
    indefinite = b"\xbf" + canonical[1:] + b"\xff"  # an indefinite-length map
    trailing = canonical + b"\x00"
    duplicate = b"\xa4" + canonical[1:] + b"\x64size\x05"
    for data in (unsorted, long_size, indefinite, trailing, duplicate):
        assert _gossip_code(data) == "gossip.codec", data.hex()


@pytest.mark.parametrize(
    ("record", "code"),
    [
        ([[OP], NODE, 5], "gossip.schema"),
        ({"ops": [OP], "node": NODE}, "gossip.schema"),
        ({"ops": [OP], "node": NODE, "size": 5, "more": 1}, "gossip.schema"),
        ({"ops": [], "node": NODE, "size": 5}, "gossip.ops"),
        ({"ops": OP, "node": NODE, "size": 5}, "gossip.ops"),
        ({"ops": [OP, "text"], "node": NODE, "size": 5}, "gossip.ops"),
        ({"ops": [OP] * (gossip.MAX_BATCH_OPS + 1), "node": NODE, "size": 5}, "gossip.ops"),
        ({"ops": [OP], "node": "12D3KooWPeer", "size": 5}, "gossip.node"),
        ({"ops": [OP], "node": b"did:key:z6Mk", "size": 5}, "gossip.node"),
        ({"ops": [OP], "node": "did:key:" + "z" * 200, "size": 5}, "gossip.node"),
        ({"ops": [OP], "node": NODE, "size": -1}, "gossip.size"),
        ({"ops": [OP], "node": NODE, "size": 2**63}, "gossip.size"),
        ({"ops": [OP], "node": NODE, "size": True}, "gossip.size"),
        ({"ops": [OP], "node": NODE, "size": 5.0}, "gossip.size"),
    ],
)
def test_wrong_shapes_are_refused_naming_the_field(record, code):
    assert _gossip_code(codec.encode(record)) == code


def test_topics_separate_networks():
    assert gossip.topic_for("devnet") != gossip.topic_for("testnet")
    assert gossip.topic_for("devnet") == gossip.topic_for("devnet")


# --- sync requests --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "request_",
    [
        {"get": "head"},
        {"get": "consistency", "old": 1, "new": 2},
        {"get": "entries", "from": 0, "to": 10, "size": 10},
        {"get": "blocks", "cids": [f.add().cid.raw]},
        {"get": "blocks", "cids": [b"x"] * MAX_BLOCKS},
    ],
)
def test_well_formed_requests_are_read(request_):
    assert _request(codec.encode(request_)) == request_


BAD_REQUESTS = [
    b"",
    b"\xff\x00garbage",
    cbor2.dumps({"get": "head", "x": 1})[:-1],  # truncated
    cbor2.dumps({"get": "entries", "to": 2, "from": 1, "size": 3}),  # keys out of DAG-CBOR order
    codec.encode(["head"]),
    codec.encode("head"),
    codec.encode({}),
    codec.encode({"get": 1}),
    codec.encode({"get": b"head"}),
    codec.encode({"get": "tail"}),
    codec.encode({"get": "head", "extra": 0}),
    codec.encode({"get": "consistency", "old": 1}),
    codec.encode({"get": "consistency", "old": -1, "new": 2}),
    codec.encode({"get": "consistency", "old": 1, "new": 2.0}),
    codec.encode({"get": "consistency", "old": True, "new": 2}),
    codec.encode({"get": "entries", "from": 0, "to": "10", "size": 10}),
    codec.encode({"get": "entries", "from": 0, "to": 10, "size": None}),
    codec.encode({"get": "blocks", "cids": []}),
    codec.encode({"get": "blocks", "cids": b"cid"}),
    codec.encode({"get": "blocks", "cids": ["text"]}),
    codec.encode({"get": "blocks", "cids": [b"x"] * (MAX_BLOCKS + 1)}),
    codec.encode({"get": "blocks", "cids": [b"x"], "more": [b"y"]}),
]


@pytest.mark.parametrize("data", BAD_REQUESTS, ids=range(len(BAD_REQUESTS)))
def test_bad_requests_are_refused_with_one_code(data):
    with pytest.raises(SyncError) as caught:
        _request(data)
    assert caught.value.code == "sync.request"
    assert caught.value.message  # names what is wrong


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=200))
def test_garbage_requests_raise_only_sync_errors(data):
    try:
        _request(data)
    except SyncError as exc:
        assert exc.code == "sync.request"


# --- the outbox -----------------------------------------------------------------------------------


def run_outbox(schedule: list[tuple[float | None, bytes]], send_time: float = 0.0) -> tuple[list, list[float]]:
    """Put each op after its delay (virtual time; None: in the same step as the one before, as the node puts the
    operations of one ingest batch); returns [(time sent, ops)] and each op's put time."""
    sent: list[tuple[float, list[bytes]]] = []
    put_at: list[float] = []

    async def send(ops: list[bytes]) -> None:
        sent.append((trio.current_time(), list(ops)))
        await trio.sleep(send_time)

    async def main() -> None:
        outbox = Outbox(send)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(outbox.run)
            for delay, op in schedule:
                if delay is not None:
                    await trio.sleep(delay)
                outbox.put(op)
                put_at.append(trio.current_time())
            await trio.sleep(gossip.FLUSH_DELAY * 10 + send_time * (len(schedule) + 1))  # virtual time: no race
            nursery.cancel_scope.cancel()

    trio.run(main, clock=MockClock(autojump_threshold=0))
    return sent, put_at


def test_one_operation_waits_for_company_then_goes_alone():
    sent, put_at = run_outbox([(0.0, b"op")])
    assert sent == [(pytest.approx(put_at[0] + gossip.FLUSH_DELAY), [b"op"])]


def test_operations_arriving_together_share_a_message():
    ops = [b"op %d" % i for i in range(10)]
    sent, _ = run_outbox([(0.001, op) for op in ops])
    assert [batch for _, batch in sent] == [ops]


def test_a_full_count_is_sent_at_once():
    ops = [b"op %d" % i for i in range(2 * gossip.MAX_BATCH_OPS + 500)]
    sent, _ = run_outbox([(None, op) for op in ops])
    assert [len(batch) for _, batch in sent] == [gossip.MAX_BATCH_OPS, gossip.MAX_BATCH_OPS, 500]
    assert {time for time, _ in sent} == {0.0}  # none waited for the delay
    assert [op for _, batch in sent for op in batch] == ops


def test_a_full_size_is_sent_at_once_and_every_message_fits():
    big = [bytes([i]) * (100 * 1024) for i in range(10)]
    sent, _ = run_outbox([(None, op) for op in big])
    assert [len(batch) for _, batch in sent] == [4, 4, 2]  # 5 x 100 KiB would pass the budget
    assert {time for time, _ in sent} == {0.0}
    for _, batch in sent:
        assert len(GossipBatch(tuple(batch), NODE, 2**62).encode()) <= gossip.MAX_MESSAGE_BYTES


def test_an_operation_too_large_for_any_message_is_left_to_sync():
    huge = b"x" * (gossip.MESSAGE_BUDGET + 1)
    sent, _ = run_outbox([(None, b"a"), (None, huge), (None, b"b")])
    assert [batch for _, batch in sent] == [[b"a", b"b"]]


@settings(max_examples=200, deadline=None)
@given(
    schedule=st.lists(
        st.tuples(
            st.sampled_from([None, None, 0.0, 0.001, 0.01, 0.029, 0.031, 0.1]),
            st.integers(1, 450) | st.just(1001),  # 1001: over the (patched) budget
        ),
        max_size=40,
    ),
    send_time=st.sampled_from([0.0, 0.005, 0.05]),
)
def test_every_operation_goes_once_in_order_within_the_limits_and_the_delay(schedule, send_time):
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(gossip, "MAX_BATCH_OPS", 5)
        patch.setattr(gossip, "MESSAGE_BUDGET", 1000)
        rng = random.Random(len(schedule))
        ops = [(delay, rng.randbytes(size)) for delay, size in schedule]
        sent, put_at = run_outbox(ops, send_time)
    kept = [(op, at) for (_, op), at in zip(ops, put_at, strict=True) if len(op) <= 1000]
    assert [op for _, batch in sent for op in batch] == [op for op, _ in kept]
    position = 0
    for time, batch in sent:
        assert 1 <= len(batch) <= 5 and sum(map(len, batch)) <= 1000
        for _ in batch:
            # an operation waits at most the delay, plus the sends queued before it
            assert time <= kept[position][1] + gossip.FLUSH_DELAY + send_time * len(sent) + 1e-9
            position += 1


def test_a_steady_flow_is_still_sent_in_batches():
    """One operation a millisecond for 300 ms, each publish taking 5 ms: batches of about FLUSH_DELAY's worth,
    so about 300 / 30 messages (each costs milliseconds of CPU on every node, whatever its size)."""
    ops = [b"op %d" % i for i in range(300)]
    sent, _ = run_outbox([(0.001, op) for op in ops], send_time=0.005)
    assert [op for _, batch in sent for op in batch] == ops
    assert len(sent) <= 300 * 0.001 / gossip.FLUSH_DELAY + 2, [len(batch) for _, batch in sent]


def test_an_origins_allowance_refills_at_its_rate_and_caps_at_its_burst():
    now = [0.0]
    allowance = gossip.Allowance(rate=10.0, burst=100.0, clock=lambda: now[0])
    origin, other = object(), object()
    assert allowance.take(origin, 100) and not allowance.take(origin, 1)  # the burst, then nothing
    assert allowance.take(other, 60)  # another origin has its own
    now[0] = 0.5
    assert allowance.take(origin, 5) and not allowance.take(origin, 1)  # half a second: five more
    assert not allowance.take(origin, 1)  # a refusal spends nothing, and nothing came back meanwhile
    now[0] = 1000.0
    assert allowance.take(origin, 100) and not allowance.take(origin, 1)  # refilled, but never above the burst


@pytest.mark.parametrize(
    ("dial", "listening", "reaches"),
    [
        ("/ip4/127.0.0.1/tcp/4645/p2p/X", ["/ip4/127.0.0.1/tcp/4645"], True),
        ("/ip4/0.0.0.0/tcp/4645/p2p/X", ["/ip4/127.0.0.1/tcp/4645"], True),  # connect() to 0.0.0.0 is loopback
        ("/ip4/127.0.0.1/tcp/4645/p2p/X", ["/ip4/0.0.0.0/tcp/4645"], True),  # a listener on every address
        ("/ip6/::1/tcp/4645/p2p/X", ["/ip6/::/tcp/4645"], True),
        ("/ip4/127.0.0.1/tcp/4646/p2p/X", ["/ip4/127.0.0.1/tcp/4645"], False),  # another port: another node
        ("/ip4/127.0.0.2/tcp/4645/p2p/X", ["/ip4/127.0.0.1/tcp/4645"], False),  # another address, bound elsewhere
        ("/ip4/192.0.2.7/tcp/4645/p2p/X", ["/ip4/0.0.0.0/tcp/4645"], False),  # TEST-NET-1: not this machine's
        ("/dns4/localhost/tcp/4645/p2p/X", ["/ip4/127.0.0.1/tcp/4645"], False),  # a name is not resolved here
    ],
)
def test_a_dial_reaches_this_nodes_listener_by_address_and_port(dial, listening, reaches):
    endpoint = tcp_endpoint(dial)
    assert (endpoint is not None and reaches_listener(endpoint, map(tcp_endpoint, listening))) is reaches


# --- discovery: what a peer tells us, and the address book --------------------------------------------


def _peer(seed: int) -> ID:
    return ID.from_pubkey(key_pair(seed.to_bytes(2, "big") * 16).public_key)


def test_announced_addresses_count_only_for_the_peer_they_name():
    alice, bob = _peer(1), _peer(2)
    addrs = [
        f"/ip4/127.0.0.1/tcp/4001/p2p/{alice}",
        f"/ip4/127.0.0.1/tcp/4002/p2p/{bob}",  # another peer's: never taken as alice's
        f"/ip4/0.0.0.0/tcp/4003/p2p/{alice}",  # unspecified: only with the address its connection comes from
        "not a multiaddr",
        7,
    ]
    assert check_addrs(alice, addrs) == [f"/ip4/127.0.0.1/tcp/4001/p2p/{alice}"]
    assert check_addrs(alice, addrs[:3], observed="10.0.0.5") == [
        f"/ip4/127.0.0.1/tcp/4001/p2p/{alice}",
        f"/ip4/10.0.0.5/tcp/4003/p2p/{alice}",
    ]
    assert check_addrs(alice, "everything") == []


@pytest.mark.parametrize(
    "message",
    [b"\xff not cbor", codec.encode([1, 2]), codec.encode({"peers": []}), codec.encode({"addrs": "x"})],
)
def test_a_malformed_peer_exchange_is_refused_with_its_code(message):
    with pytest.raises(LedgerError) as caught:
        decode_message(message, _peer(1))
    assert caught.value.code == "peers.message"


def test_shared_peers_with_bad_ids_or_addresses_are_skipped():
    alice, bob = _peer(1), _peer(2)
    message = codec.encode(
        {
            "addrs": [f"/ip4/127.0.0.1/tcp/4001/p2p/{alice}"],
            "peers": [
                [bob.to_bytes(), [f"/ip4/127.0.0.1/tcp/4002/p2p/{bob}", f"/ip4/127.0.0.1/tcp/4009/p2p/{alice}"]],
                [b"not an id", ["/ip4/127.0.0.1/tcp/4003"]],
                "junk",
            ],
        }
    )
    own, shared = decode_message(message, alice)
    assert own == [f"/ip4/127.0.0.1/tcp/4001/p2p/{alice}"]
    assert shared == [(bob, [f"/ip4/127.0.0.1/tcp/4002/p2p/{bob}"])]


def test_the_address_book_is_bounded_backs_off_failures_and_forgets_the_worst_first():
    own = _peer(1)
    book = AddressBook(own)
    book.learn(own, ["/ip4/127.0.0.1/tcp/1/p2p/x"])  # never itself
    assert own not in book.known
    peers = [_peer(seed) for seed in range(2, 2 + MAX_KNOWN)]
    for number, peer in enumerate(peers):
        book.learn(peer, [f"/ip4/127.0.0.1/tcp/{1000 + number}/p2p/{peer}"])
    assert len(book.known) == MAX_KNOWN
    newcomer = _peer(1000)
    book.learn(newcomer, [f"/ip4/127.0.0.1/tcp/9/p2p/{newcomer}"])
    assert newcomer not in book.known  # a full book of peers that never failed keeps them
    book.dialled(peers[3], ok=False)
    book.dialled(peers[3], ok=False)
    assert peers[3] not in book.candidates(set())  # backing off
    book.learn(newcomer, [f"/ip4/127.0.0.1/tcp/9/p2p/{newcomer}"])
    assert newcomer in book.known and peers[3] not in book.known  # the one that failed went first
    assert len(book.known) == MAX_KNOWN
    book.dialled(peers[4], ok=False)
    book.dialled(peers[4], ok=True)
    assert peers[4] in book.candidates(set()) and peers[4] not in book.candidates({peers[4]})


# --- reconciliation: a listed item read by hand ----------------------------------------------------------------


def _item_by_the_general_decoder(payload: bytes) -> tuple[int, bytes] | None:
    """What decode_item must accept: exactly canonical DAG-CBOR [uint, a binary CID of a DAG-CBOR operation]."""
    try:
        item = codec.decode(payload)
    except LedgerError:
        return None
    if type(item) is not list or len(item) != 2 or type(item[0]) is not int or item[0] < 0:
        return None
    if type(item[1]) is not bytes or len(item[1]) != CID_LENGTH or item[1][:4] != CID.for_block(b"").raw[:4]:
        return None
    return item[0], item[1]


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(
    clock=st.one_of(st.integers(0, 30), st.integers(0, 2**64 - 1)),
    digest=st.binary(min_size=32, max_size=32),
    edit=st.one_of(
        st.none(),
        st.tuples(st.integers(0, 60), st.integers(0, 255)),  # one byte changed
        st.integers(0, 60),  # cut short
        st.binary(min_size=1, max_size=3),  # trailing bytes
    ),
)
def test_a_listed_item_read_by_hand_is_what_the_general_decoder_accepts(clock, digest, edit):
    payload = codec.encode([clock, CID.for_block(b"").raw[:4] + digest])
    if isinstance(edit, tuple):
        at, value = edit
        payload = payload[:at] + bytes([value]) + payload[at + 1 :] if at < len(payload) else payload
    elif isinstance(edit, int):
        payload = payload[:edit]
    elif isinstance(edit, bytes):
        payload += edit
    expected = _item_by_the_general_decoder(payload)
    if edit is None:
        assert encode_item(clock, CID.for_block(b"").raw[:4] + digest) == payload  # the server's, by hand
    if expected is None:
        with pytest.raises(LedgerError) as caught:
            decode_item(payload)
        assert caught.value.code == "sync.list"
    else:
        assert decode_item(payload) == expected


# --- the fetcher's chunks ------------------------------------------------------------------------------


def _fetcher(usable: list[ID], peer: Callable[[ID], Peer] = Peer) -> Fetcher:
    """A fetcher with no network, whose ledger holds nothing, for the peers `usable` (`peer` gives each's state)."""
    return Fetcher(
        None,  # type: ignore[arg-type]
        lambda: set(usable),
        lambda: None,
        _HasNothing,  # type: ignore[arg-type]
        Counters(),
        peer,
        Counter(),
        None,  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]
    )


def _fetcher_wanting(holders: list[ID]) -> Fetcher:
    """A fetcher that found more than a window of operations missing (a catch-up: none waits for gossip), each held
    by every one of `holders`."""
    fetcher = _fetcher(holders)
    found = [(clock, CID.for_block(clock.to_bytes(4, "big")).raw) for clock in range(FETCH_WINDOW + 1)]
    for peer in holders:
        fetcher.want(found, peer, _HasNothing())  # type: ignore[arg-type]
    return fetcher


class _HasNothing:
    def has(self, cid: CID) -> bool:
        return False


def test_a_window_gives_one_peer_at_most_two_chunks_and_keeps_the_rest_wanted():
    """The only holder known as a catch-up begins is asked for 2 chunks, not the window's 8 at once (it answered them
    together, the first late); what no holder has room for stays wanted, first in line."""
    only = ID(b"\x01" * 34)
    fetcher = _fetcher_wanting([only])
    window = fetcher._window()
    chunks = fetcher._assign(window)
    assert [(peer, len(cids)) for peer, cids in chunks] == [(only, MAX_BLOCKS)] * PEER_CHUNKS
    assigned = [cid for _, cids in chunks for cid in cids]
    assert assigned == sorted(fetcher.wanted, key=lambda cid: fetcher.wanted[cid].clock)[: len(assigned)]
    assert all(fetcher.wanted[cid].in_flight == (cid in assigned) for cid in fetcher.wanted)
    assert fetcher._window()[: len(window) - len(assigned)] == window[len(assigned) :]  # the rest next, in order


def test_a_window_over_five_holders_spreads_its_chunks():
    holders = [ID(bytes([number]) * 34) for number in range(1, 6)]
    fetcher = _fetcher_wanting(holders)
    chunks = fetcher._assign(fetcher._window())
    per_peer = Counter(peer for peer, _ in chunks)
    assert len(chunks) == FETCH_WINDOW // MAX_BLOCKS and max(per_peer.values()) <= PEER_CHUNKS


def test_a_first_rounds_listing_waits_for_the_other_first_rounds_only_and_a_later_ones_for_gossip(monkeypatch):
    """What a peer lists in its first round since it connected, it held while the two were apart: gossip will not
    bring it, so it is fetched once every usable peer's first round is over (each may hold some of it), without
    FETCH_GRACE's wait. What a later round lists may be gossip in flight: held back for FETCH_GRACE."""
    monkeypatch.setattr(fetch, "FETCH_GRACE", 600.0)  # no run of this test lasts that long
    first, second = ID(b"\x01" * 34), ID(b"\x02" * 34)
    peers = {peer_id: Peer(peer_id, connected_since=1.0) for peer_id in (first, second)}
    nothing = _HasNothing()
    fetcher = _fetcher(list(peers), peers.__getitem__)
    unheard, later = ([(clock, CID.for_block(bytes([clock])).raw)] for clock in (1, 2))
    fetcher.want(unheard, first, nothing, first_round=True)  # type: ignore[arg-type]
    peers[first].last_sync = 2.0  # its first round is over; the second peer's is not
    assert fetcher._window() == []
    peers[second].last_sync = 2.0
    fetcher.want(later, second, nothing)  # type: ignore[arg-type]
    assert fetcher._window() == [unheard[0][1]]  # the later listing waits for gossip
    assert set(fetcher.wanted) == {unheard[0][1], later[0][1]} and not fetcher.stranded
