"""Several real daemons on 127.0.0.1, each its own process, joined by libp2p: gossip, sync, partitions, forks.

Every node of a test shares one network.json (the genesis). Readiness and convergence are awaited by
polling RPC state against a deadline, never by a fixed sleep; every daemon is stopped in a `finally`.
"""

from __future__ import annotations

import re
import shutil
import socket
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from bench.workload import operations
from ledger import codec
from ledger.embedder import embedder_for, pack_float16
from ledger.keys import AuthorKey
from ledger.ledger import Ledger
from ledger.local_model import NETWORK
from ledger.merkle import TreeHead
from ledger.ops import Embedding, Experience, Kind, Operation, sign
from ledger.params import NetworkParams
from tests.daemons import START_TIMEOUT, Daemon, expledger, init_home, start
from tests.factories import SEED_TEXTS

P2P = "/ip4/127.0.0.1/tcp/0"
CONVERGE = 60.0  # seconds a network gets to converge (sync runs every 10 s; gossip takes milliseconds)
STARTS_AT_ONCE = 3
MANY_START_TIMEOUT = 240.0  # seconds a daemon started beside others gets to be ready (the cores are shared)


#: experiences far from one another (near-duplicates would be absorbed, not listed)
DISTINCT = [
    "When a proof uses a lemma, state the lemma's conditions and check each one.",
    "When counting arrangements with repeated letters, divide by the repeats' factorials.",
    "When an integral has a square root of a quadratic, try a trigonometric substitution.",
    "When a sequence is defined recursively, compute the first terms and guess a pattern.",
    "When probabilities must sum to one, use the complement for the hardest case.",
    "When a function is even or odd, exploit the symmetry to halve the work.",
    "When a graph problem asks for shortest paths, check for negative edge weights first.",
    "When a word problem gives rates, write every quantity in the same units.",
    "When modular arithmetic gets large, reduce intermediate results at every step.",
    "When a matrix is triangular, read its determinant off the diagonal.",
    "When an inequality looks symmetric, try the equal case to find the extremum.",
    "When a physics answer has units, check them against the question before simplifying.",
]


def wait_until(check: Callable[[], Any], what: str, timeout: float = CONVERGE) -> Any:
    """Poll `check` until it returns something truthy; fail naming `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.05)


class Network:
    """Daemons started in one directory, all on one genesis; stopped when the block ends."""

    def __init__(self, root: Path, stack: ExitStack) -> None:
        self.root = root
        self.stack = stack
        self.genesis: Path | None = None
        self.nodes: dict[str, Daemon] = {}

    def home(
        self, name: str, bootstrap: tuple[str, ...] = (), peers: int | None = None, retrieval_model: str = NETWORK
    ) -> Path:
        """`peers`: its [p2p] peers (0: no discovery; None: the default); `retrieval_model`: its [retrieval] model
        (by default the network's embedding: these tests are of the network, and the local model's start and its
        background embedding of every experience received, milliseconds each, would take their cores)."""
        home = self.root / name
        init_home(home, network=self.genesis, p2p=P2P, retrieval_model=retrieval_model)
        if self.genesis is None:
            self.genesis = home / "network.json"
        config = home / "config.toml"
        listed = ", ".join(f'"{addr}"' for addr in bootstrap)
        text = config.read_text().replace("bootstrap = []", f"bootstrap = [{listed}]")
        if peers is not None:
            text = re.sub(r"(?m)^peers = \d+", f"peers = {peers}", text)
        config.write_text(text)
        return home

    def start(
        self,
        name: str,
        bootstrap: tuple[str, ...] = (),
        peers: int | None = None,
        timeout: float = START_TIMEOUT,
        retrieval_model: str = NETWORK,
    ) -> Daemon:
        home = self.root / name
        if not home.exists():
            self.home(name, bootstrap, peers, retrieval_model)
        daemon = start(home, timeout=timeout)
        self.stack.callback(daemon.stop)
        self.nodes[name] = daemon
        return daemon

    def start_many(
        self, names: list[str], bootstrap: tuple[str, ...] = (), retrieval_model: str = NETWORK
    ) -> list[Daemon]:
        """Initialise and start several daemons, STARTS_AT_ONCE at a time (each is seconds of CPU loading the
        process; more at once only share the cores); returned in `names` order."""
        assert self.genesis is not None, "start the first node alone: its home holds the genesis"

        def init_and_start(name: str) -> Daemon:
            return self.start(name, bootstrap, timeout=MANY_START_TIMEOUT, retrieval_model=retrieval_model)

        with ThreadPoolExecutor(max_workers=STARTS_AT_ONCE) as pool:
            return list(pool.map(init_and_start, names))

    def stop(self, name: str) -> None:
        assert self.nodes.pop(name).stop() == 0


@contextmanager
def network(tmp_path: Path) -> Iterator[Network]:
    with ExitStack() as stack:
        yield Network(tmp_path, stack)


def addr(node: Daemon) -> str:
    return (node.home / "p2p.addrs").read_text().split()[0]


def peer_id(node: Daemon) -> str:
    return addr(node).rsplit("/p2p/", 1)[1]


def state(node: Daemon) -> tuple[str, int]:
    found = node.call("state_root")
    return found["state_root"], found["log_size"]


def has(node: Daemon, exp_id: str) -> bool:
    return "error" not in node.request("get", {"id": exp_id})


def converged(nodes: list[Daemon], size: int) -> bool:
    """Every node holds `size` operations and the same state root."""
    states = {state(node) for node in nodes}
    return len(states) == 1 and next(iter(states))[1] == size


def add(node: Daemon, text: str, domain: str = "math.geometry") -> str:
    return node.call("add", {"text": text, "domain": domain, "confidence": 0.8})["cid"]


def test_two_nodes_exchange_operations_both_ways(tmp_path):
    with network(tmp_path) as net:
        a = net.start("a")
        b = net.start("b", (addr(a),))
        wait_until(lambda: b.call("status")["p2p"]["sync"]["peers"] == 1, "b connected to a")
        on_a = add(a, "When two lines intersect, check the point lies on both segments, not on their extensions.")
        wait_until(lambda: has(b, on_a), "a's experience on b")
        on_b = add(b, "When a sum telescopes, write out its first three terms before simplifying.", "math.series")
        wait_until(lambda: has(a, on_b), "b's experience on a")
        wait_until(lambda: converged([a, b], 2), "equal state roots")
        table = {p["peer_id"]: p for p in b.call("peers")["peers"]}
        assert table[peer_id(a)]["connected"] and table[peer_id(a)]["invalid"] == 0
        wait_until(lambda: b.call("status")["p2p"]["sync"]["state"] == "in sync", "b's sync to read a's log")
        metrics = {
            line.split()[0]: float(line.split()[1])
            for line in b.http.get(b.url + "metrics").text.splitlines()
            if line.startswith("expledger_p2p_")
        }
        assert metrics["expledger_p2p_peers_connected"] == 1 and metrics["expledger_p2p_peers_banned"] == 0
        assert (
            metrics["expledger_p2p_gossip_sent_total"] >= 1 and metrics["expledger_p2p_operations_gossiped_total"] >= 1
        )


def test_five_nodes_in_a_line_converge_from_both_ends(tmp_path):
    with network(tmp_path) as net:
        nodes = [net.start("n0")]
        for index in range(1, 5):
            nodes.append(net.start(f"n{index}", (addr(nodes[-1]),)))
        first = add(nodes[0], "When a geometry answer seems off, draw the figure to scale before computing.")
        last = add(
            nodes[-1], "When a recurrence looks linear, solve its characteristic equation first.", "math.algebra"
        )
        for node in nodes:
            wait_until(lambda node=node: has(node, first) and has(node, last), f"both ends' experiences on {node.home}")
        wait_until(lambda: converged(nodes, 2), "equal state roots on all five")


def test_a_node_that_was_offline_catches_up_through_sync(tmp_path):
    with network(tmp_path) as net:
        a = net.start("a")
        b = net.start("b", (addr(a),))
        add(a, "When a probability seems too high, check whether the events overlap.", "math.probability")
        wait_until(lambda: converged([a, b], 1), "b has the first operation")
        net.stop("b")  # b misses every gossip message from here on
        made = [add(a, text, "math.mixed") for text in DISTINCT]
        b = net.start("b")
        wait_until(lambda: converged([a, b], 1 + len(DISTINCT)), "b caught up with a")
        assert all(has(b, cid) for cid in made)
        # sync fetched only what b lacked, each once, not a's whole log (a re-offers the gossip messages of its
        # last seconds to a peer that connects, as GossipSub does: some may come that way instead)
        counters = b.call("peers")["self"]["counters"]
        assert counters["sync_fetched"] <= len(DISTINCT) and counters["sync_duplicates"] == 0


def test_a_burst_through_a_line_arrives_whole(tmp_path):
    """3,000 operations submitted as fast as a node takes them: gossip delivers messages out of order and
    concurrently, so many operations wait for their parents; none may be lost."""
    with network(tmp_path) as net:
        nodes = [net.start("n0")]
        for index in (1, 2):
            nodes.append(net.start(f"n{index}", (addr(nodes[-1]),)))
        wait_until(lambda: nodes[1].call("status")["p2p"]["sync"]["peers"] == 2, "the line linked")
        params = NetworkParams.from_file(net.genesis)
        ops = [block.data.hex() for block in operations(3000, params)]
        for at in range(0, len(ops), 100):
            body = [
                {"jsonrpc": "2.0", "id": i, "method": "submit", "params": {"operation": op}}
                for i, op in enumerate(ops[at : at + 100])
            ]
            answers = nodes[0].http.post(nodes[0].url, json=body).json()
            assert all("error" not in answer for answer in answers), answers
        wait_until(lambda: converged(nodes, len(ops)), "every operation on every node")
        for node in nodes[1:]:
            assert node.call("peers")["self"]["orphans"] == {"waiting": 0, "evicted": 0, "expired": 0}


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_a_node_refuses_to_dial_itself_by_peer_id_or_by_address_and_says_why_a_dial_failed_in_its_log(tmp_path):
    from p2p.host import key_pair
    from p2p.host import peer_id as id_of

    other = str(id_of(key_pair(bytes(range(32)))))
    with network(tmp_path) as net:
        a = net.start("a")
        own, own_id = addr(a), peer_id(a)
        where = own.rsplit("/p2p/", 1)[0]
        for target in (own, f"/ip4/127.0.0.1/tcp/{_free_port()}/p2p/{own_id}", f"{where}/p2p/{other}"):
            error = a.request("peers.connect", {"addr": target})["error"]
            assert (error["code"], error["data"]["code"], error["data"]["field"]) == (-32602, "p2p.self_dial", "addr")
            assert error["message"].endswith("; a node does not dial itself"), error
        assert a.call("peers")["peers"] == []  # it never listed itself as a peer
        cli = expledger("connect", own, home=a.home)
        assert cli.returncode == 1 and cli.stderr.startswith("expledger: error: p2p.self_dial: addr: "), cli.stderr

        refused = f"/ip4/127.0.0.1/tcp/{_free_port()}/p2p/{other}"  # nobody listens there
        error = a.request("peers.connect", {"addr": refused})["error"]
        assert (error["code"], error["message"]) == (-32005, f"{refused}: cannot connect (the node's log says why)")
        garbage = "/ip4/" + "9" * 900
        error = a.request("peers.connect", {"addr": garbage})["error"]
        assert (error["code"], error["data"]["code"]) == (-32602, "p2p.address") and len(error["message"]) < 200
    assert f"dialling {refused} failed" in (tmp_path / "a" / "daemon.stderr").read_text()


def test_partitioned_halves_heal_and_the_conflict_rules_hold(tmp_path):
    with network(tmp_path) as net:  # without discovery: a, b, c, d would find each other again
        a = net.start("a", peers=0)
        b = net.start("b", (addr(a),), peers=0)
        c = net.start("c", peers=0)
        d = net.start("d", (addr(c),), peers=0)
        everyone = [a, b, c, d]
        b.call("peers.connect", {"addr": addr(c)})  # the bridge: not a bootstrap peer, so never redialled
        doomed = add(a, "When a triangle's angles are given, check that they sum to a straight angle.")
        contested = add(d, "When simplifying radicals, factor out perfect squares first.", "math.algebra")
        wait_until(lambda: converged(everyone, 2), "the base library everywhere")

        b.call("peers.disconnect", {"peer_id": peer_id(c)})
        wait_until(lambda: b.call("status")["p2p"]["sync"]["peers"] == 1, "the partition")
        a.call("delete", {"target": doomed, "reason": "covered by a more general experience"})
        b.call("modify", {"target": contested, "text": "When simplifying radicals, factor out the largest square."})
        c.call(
            "modify",
            {"target": doomed, "text": "When a triangle's angles are given, check they sum to two right angles."},
        )
        d.call("modify", {"target": contested, "text": "When simplifying radicals, factor the radicand into primes."})
        wait_until(lambda: converged([a, b], 4) and converged([c, d], 4), "each half converged on its own")
        assert state(a) != state(c)

        b.call("peers.connect", {"addr": addr(c)})
        wait_until(lambda: converged(everyone, 6), "all four converged after the heal")
        for node in everyone:
            assert node.call("get", {"id": doomed})["library"]["status"] == "deleted"  # delete beats modify
            assert node.call("get", {"id": contested})["library"]["conflicted"] is True


def test_a_peer_that_rewrites_its_log_is_detected_and_refused(tmp_path):
    with network(tmp_path) as net:
        a = net.start("a")
        b = net.start("b", (addr(a),))
        for text in DISTINCT[:2]:
            add(b, text, "math.mixed")
        wait_until(lambda: converged([a, b], 2), "a holds b's operations")
        b_id = peer_id(b)
        wait_until(
            lambda: {p["peer_id"]: p for p in a.call("peers")["peers"]}[b_id]["sync"]["head"] == 2,
            "a verified a head of b's of size 2",
        )
        old_head = b.call("head")
        net.stop("b")

        # b's node key, another history: the same node signs heads of a log that does not extend the first
        data = b.home / "data"
        key = (data / "node.key").read_bytes()
        shutil.rmtree(data)
        data.mkdir(mode=0o700)
        (data / "node.key").write_bytes(key)
        (data / "node.key").chmod(0o600)
        params = NetworkParams.from_file(b.home / "network.json")
        ledger = Ledger.open(data, params)
        try:
            embedder, author = embedder_for(params), AuthorKey.generate()
            ops = []
            for text in SEED_TEXTS[:3]:
                vector = Embedding(embedder.model_id, embedder.dim, pack_float16(embedder.embed([text])[0]))
                content = Experience(text, ("math", "geometry"), 0.8, vector)
                ops.append(sign(Operation(Kind.ADD, author.did, 1, (), int(time.time()), content), author).data)
            receipts = ledger.ingest(ops)
            assert all(receipt.verdict.value == "accepted" for receipt in receipts), receipts
            assert ledger.view().tree_head().node == old_head["node"]
        finally:
            ledger.close()
        b = net.start("b")

        def refused() -> dict[str, Any] | None:
            row = {p["peer_id"]: p for p in a.call("peers")["peers"]}.get(peer_id(b))
            return row if row and row["banned_for"] > 0 and not row["connected"] else None

        row = wait_until(refused, "a refusing b")
        assert row["sync"]["state"] == "failed: sync.fork"
        evidence = [codec.decode(path.read_bytes()) for path in (a.home / "p2p" / "forks").glob("*.cbor")]
        assert len(evidence) == 1 and evidence[0]["node"] == old_head["node"]
        earlier, later = TreeHead.from_bytes(evidence[0]["earlier"]), TreeHead.from_bytes(evidence[0]["later"])
        assert earlier.verify() and later.verify() and earlier.node == later.node
        assert (earlier.size, earlier.root.hex()) == (old_head["size"], old_head["root"])
        assert later.size == 3
        assert state(a)[1] == 2  # nothing of the rewritten log was taken


def peer_count(node: Daemon) -> int:
    return node.call("status")["p2p"]["sync"]["peers"]


def test_ten_nodes_that_know_only_the_first_find_each_other_and_outlive_it(tmp_path):
    """Discovery: every node's [p2p] bootstrap names node 1 alone, yet each comes to hold 4 peers or more, and
    stopping node 1 partitions no one: after an operation submitted to node 5 the nine left have equal state roots."""
    with network(tmp_path) as net:
        first = net.start("n1")
        others = net.start_many([f"n{index}" for index in range(2, 11)], (addr(first),))
        for node in [first, *others]:
            wait_until(lambda node=node: peer_count(node) >= 4, f"{node.home.name} holding 4 peers", timeout=120)
        net.stop("n1")
        fifth = others[3]
        add(fifth, DISTINCT[0], "math.mixed")
        wait_until(lambda: converged(others, 1), "the operation on the nine left, with equal state roots")
