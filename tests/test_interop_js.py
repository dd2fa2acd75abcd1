"""Interop with another libp2p implementation: a js-libp2p peer (tests/interop/peer.mjs) joins a devnet of real
daemons over TCP + Noise + yamux + multistream, on the network's gossipsub topic.

Both ways: the JS peer receives the operations our nodes gossip and checks each with JavaScript libraries only
(@ipld/dag-cbor, multiformats, @noble/curves); then it publishes an operation it built and signed itself, which
every Python node must accept and apply. The JS packages are installed from tests/interop/package-lock.json
(`npm ci`); docs/INTEROP.md says what each side had to agree on.
"""

from __future__ import annotations

import hashlib
import json
import queue
import random
import re
import shutil
import string
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from ledger.embedder import embedder_for, pack_float16
from ledger.keys import AuthorKey
from ledger.ops import Embedding, Example, Experience, Kind, Operation, decode_block, sign
from ledger.params import NetworkParams
from tests.daemons import Daemon
from tests.test_network import Network, add, addr, converged, has, network, peer_id, wait_until

INTEROP = Path(__file__).parent / "interop"
NODE, NPM = shutil.which("node"), shutil.which("npm")
NPM_TIMEOUT = 600.0  # a first install downloads ~110 packages; later runs reuse node_modules or npm's cache
EVENT_TIMEOUT = 30.0  # seconds to wait for one event of the JS peer
STAMP = INTEROP / "node_modules" / ".expledger-lock.sha256"

pytestmark = pytest.mark.skipif(
    NODE is None or NPM is None, reason="node and npm are not on PATH: the js-libp2p interop test needs Node.js 20+"
)

#: what the JS peer writes and signs (an add, so its embedding comes from our embedder: see docs/INTEROP.md)
JS_TEXT = "When a peer from another implementation joins, verify each gossiped operation before trusting it."
JS_CONTENT = {"text": JS_TEXT, "domain": ["p2p", "interop"], "confidence": 1.0}  # 1.0: see peer.mjs's Float64


@pytest.fixture(scope="module")
def js_packages() -> Path:
    """`npm ci` in tests/interop, exactly the lockfile's packages; skipped when node_modules already holds them."""
    lock = hashlib.sha256((INTEROP / "package-lock.json").read_bytes()).hexdigest()
    if not STAMP.exists() or STAMP.read_text() != lock:
        result = subprocess.run(
            [NPM, "ci", "--prefer-offline", "--no-audit", "--no-fund"],
            cwd=INTEROP,
            capture_output=True,
            text=True,
            timeout=NPM_TIMEOUT,
        )
        assert result.returncode == 0, f"npm ci failed in {INTEROP}:\n{result.stderr[-3000:]}"
        STAMP.write_text(lock)
    return INTEROP


class JsPeer:
    """The JS peer as a process: its JSON events read by a thread into a queue (and a file, to read after a
    failure), commands written to its stdin."""

    def __init__(self, process: subprocess.Popen[str], transcript: Path) -> None:
        self.process = process
        self.transcript = transcript
        self.events: queue.Queue[dict[str, Any]] = queue.Queue()
        self.seen: list[dict[str, Any]] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        with open(self.transcript, "w") as transcript:
            for line in self.process.stdout:
                transcript.write(line)
                transcript.flush()
                if line.startswith("{"):
                    self.events.put(json.loads(line))

    def send(self, command: dict[str, Any]) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(command) + "\n")
        self.process.stdin.flush()

    def wait_for(self, match: Callable[[dict[str, Any]], bool], what: str, timeout: float = EVENT_TIMEOUT) -> Any:
        """The first event (seen before or arriving now) that `match` accepts; fails naming `what`."""
        for event in self.seen:
            if match(event):
                return event
        try:
            while True:
                event = self.events.get(timeout=timeout)
                self.seen.append(event)
                assert event["event"] != "error", f"the JS peer reported an error: {event}"
                if match(event):
                    return event
        except queue.Empty:
            status = self.process.poll()
            state = "running" if status is None else f"exited with status {status}"
            raise AssertionError(
                f"timed out after {timeout:.0f} s waiting for the JS peer ({state}; its stderr is beside "
                f"{self.transcript}): {what}"
            ) from None

    def drain(self) -> list[dict[str, Any]]:
        """Every event so far, including those no `wait_for` has looked at yet."""
        while not self.events.empty():
            self.seen.append(self.events.get_nowait())
        return self.seen

    def stop(self) -> None:
        """SIGTERM (it stops its libp2p node and exits), SIGKILL if it has not exited within 10 s."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        assert self.process.stdin is not None
        self.process.stdin.close()
        self._reader.join(10)


@contextmanager
def js_peer(folder: Path, network_id: str, connect: list[str], logs: Path, *flags: str) -> Iterator[JsPeer]:
    """The JS peer dialling `connect` (`flags`: more of its options); its stdout and stderr are kept in `logs`."""
    argv = [str(NODE), str(folder / "peer.mjs"), "--network", network_id, *flags]
    for address in connect:
        argv += ["--connect", address]
    with open(logs / "js-peer.stderr", "w") as stderr:
        process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, text=True)
    peer = JsPeer(process, logs / "js-peer.events")
    try:
        yield peer
    finally:
        peer.stop()


def operations_verified(peer: JsPeer, cids: set[str]) -> dict[str, dict[str, Any]]:
    """The JS peer's findings on each of `cids`, once it has reported on all of them."""
    found: dict[str, dict[str, Any]] = {}

    def collect(event: dict[str, Any]) -> bool:
        if event["event"] == "operation" and event["cid"] in cids:
            found[event["cid"]] = event
        return found.keys() == cids

    peer.wait_for(collect, f"its verdicts on {sorted(cids)}")
    return found


def start_star(net: Network, names: list[str]) -> list[Daemon]:
    """Daemons initialised and started at once (each loads for seconds), then joined to the first as a star.
    They rank by the network's embedding: no background model to load and run beside the test."""

    def make_home(name: str) -> None:
        config = net.home(name) / "config.toml"
        config.write_text(re.sub(r'(?m)^model = ".*"$', 'model = "network"', config.read_text(), count=1))

    make_home(names[0])  # the first home writes the genesis the others copy
    with ThreadPoolExecutor(len(names)) as pool:
        list(pool.map(make_home, names[1:]))
        nodes = list(pool.map(net.start, names))
    for node in nodes[1:]:
        node.call("peers.connect", {"addr": addr(nodes[0])})
    wait_until(lambda: nodes[0].call("status")["p2p"]["sync"]["peers"] == len(nodes) - 1, "the star linked")
    return nodes


def js_peer_record(node: Daemon, js_id: str) -> dict[str, Any] | None:
    return next((p for p in node.call("peers")["peers"] if p["peer_id"] == js_id), None)


def big_contents(params: NetworkParams, count: int, seed: int) -> list[dict[str, Any]]:
    """`count` distinct experiences of ~30 KB each (8 long examples), with our model's embeddings: together more
    than yamux's initial 256 KiB stream window, so one gossip message of them needs flow control both ways."""
    rng = random.Random(seed)
    words = [" ".join("".join(rng.choices(string.ascii_lowercase, k=6)) for _ in range(4)) for _ in range(count)]
    texts = [f"When relaying a large batch, check {noise} before storing it." for noise in words]
    vectors = embedder_for(params).embed(texts)
    filler = "relay " * 320
    examples = [{"input": filler, "output": filler, "correct": True}] * 8
    return [
        {
            "text": text,
            "domain": ["p2p", "interop"],
            "confidence": 0.5,
            "examples": examples,
            "embedding": {
                "model": params.embedding_model,
                "dim": params.embedding_dim,
                "values": pack_float16(v).hex(),
            },
        }
        for text, v in zip(texts, vectors, strict=True)
    ]


def signed_in_python(content: dict[str, Any]) -> bytes:
    """`content` as an add signed by a fresh Python author key."""
    embedding = content["embedding"]
    experience = Experience(
        content["text"],
        tuple(content["domain"]),
        content["confidence"],
        Embedding(embedding["model"], embedding["dim"], bytes.fromhex(embedding["values"])),
        tuple(Example(**example) for example in content["examples"]),
    )
    op = Operation(Kind.ADD, "", 1, (), int(time.time()), content=experience)
    return sign(op, AuthorKey.generate()).data


def submit_all(node: Daemon, ops: list[bytes]) -> list[str]:
    """Submit `ops` in one JSON-RPC batch (so the node gossips them together); their CIDs."""
    body = [
        {"jsonrpc": "2.0", "id": i, "method": "submit", "params": {"operation": op.hex()}} for i, op in enumerate(ops)
    ]
    answers = sorted(node.http.post(node.url, json=body).json(), key=lambda answer: answer["id"])
    assert all("error" not in answer for answer in answers), answers
    return [answer["result"]["cid"] for answer in answers]


def check_connection(js: JsPeer, node: Daemon) -> None:
    """The two stacks agreed on Noise, yamux and meshsub 1.1.0 (multistream-select each time); identify told the
    JS peer what the node serves; a libp2p ping goes round."""

    def identified(event: dict[str, Any]) -> bool:
        return event["event"] == "peers" and any(
            c["peer"] == peer_id(node) and "/meshsub/1.1.0" in c["streams"] and c["protocols"]
            for c in event["connections"]
        )

    js.send({"cmd": "peers"})
    peers = js.wait_for(identified, f"{node.home.name} identified, with a meshsub stream")
    (connection,) = [c for c in peers["connections"] if c["peer"] == peer_id(node)]
    assert connection["encryption"] == "/noise" and connection["multiplexer"] == "/yamux/1.0.0", connection
    assert {"/meshsub/1.1.0", "/expledger/sync/1", "/ipfs/ping/1.0.0"} <= set(connection["protocols"]), connection
    js.send({"cmd": "ping"})
    assert js.wait_for(lambda event: event["event"] == "ping", "a ping round trip")["peer"] == peer_id(node)


def check_js_verifies(js: JsPeer, made: dict[str, str]) -> None:
    """Every operation of `made` (CID -> author did) decoded, its CID recomputed and its signature verified in JS."""
    for cid, op in operations_verified(js, set(made)).items():
        assert op["valid"] and op["canonical"] and op["signature"] == "valid", op
        assert op["shortcut_agrees"] and op["altered_rejected"], op
        assert op["author"] == made[cid], op
    assert all(event["accepted"] for event in js.seen if event["event"] == "batch")


def check_applied(nodes: list[Daemon], cids: list[str], author: str) -> None:
    """Every node applied every one of `cids` (a live experience created by `author`)."""
    for node in nodes:
        for cid in cids:
            wait_until(lambda node=node, cid=cid: has(node, cid), f"the JS peer's {cid} applied on {node.home.name}")
            shown = node.call("get", {"id": cid})
            assert shown["library"]["status"] == "live" and shown["library"]["created_by"] == author, shown


def test_a_js_libp2p_peer_verifies_our_operations_and_ours_apply_its_own(tmp_path, js_packages):
    with network(tmp_path) as net:
        n1, n2, n3 = nodes = start_star(net, ["n1", "n2", "n3"])
        params = NetworkParams.from_file(net.genesis)
        authors = {node.home.name: node.call("status")["author"] for node in nodes}

        # the JS peer dials n2 only: what n3 publishes reaches it through two Python hops (n1, n2), and the reverse
        with js_peer(js_packages, params.network_id, [addr(n2)], tmp_path) as js:
            ready = js.wait_for(lambda event: event["event"] == "ready", "ready")
            assert ready["topic"] == n2.call("peers")["self"]["topic"] == f"/expledger/{params.network_id}/ops/1"
            js.wait_for(lambda event: event["event"] == "peers" and peer_id(n2) in event["mesh"], "n2 in its mesh")
            check_connection(js, n2)

            # ours -> JS: single operations from each node, then one message larger than a yamux window
            # (n1's is sure of itself: confidence 1.0, a float64 that @ipld/dag-cbor alone would write as the integer 1)
            lemma = {"text": "When a proof uses a lemma, state its conditions and check each one.", "confidence": 1.0}
            made = {
                n1.call("add", {**lemma, "domain": "math.proofs"})["cid"]: "n1",
                add(n3, "When a word problem gives rates, write every quantity in the same units.", "math.rates"): "n3",
                add(n2, "When a matrix is triangular, read its determinant off the diagonal.", "math.algebra"): "n2",
            }
            check_js_verifies(js, {cid: authors[name] for cid, name in made.items()})
            from_n3 = next(e for e in js.seen if e["event"] == "batch" and e["origin"] == peer_id(n3))
            assert from_n3["forwarder"] == peer_id(n2)  # signed by n3's peer key, relayed by n1 and n2
            big = [signed_in_python(content) for content in big_contents(params, 12, seed=1)]
            big_cids = submit_all(n3, big)
            check_js_verifies(js, {cid: decode_block(op).op.author for cid, op in zip(big_cids, big, strict=True)})

            # JS -> ours: an add the JS peer builds and signs, with the embedding our pinned model gives its text
            values = pack_float16(embedder_for(params).embed([JS_TEXT])[0]).hex()
            embedding = {"model": params.embedding_model, "dim": params.embedding_dim, "values": values}
            js.send({"cmd": "publish", "contents": [{**JS_CONTENT, "embedding": embedding}]})
            published = js.wait_for(lambda event: event["event"] == "published", "its publish")
            assert peer_id(n2) in published["recipients"]
            assert published["parents"] and set(published["parents"]) <= set(made) | set(big_cids)
            check_applied(nodes, published["cids"], ready["did"])
            assert n1.call("get", {"id": published["cids"][0]})["text"] == JS_TEXT
            # and twelve in one message larger than a yamux window
            js.send({"cmd": "publish", "contents": big_contents(params, 12, seed=2)})
            large = js.wait_for(lambda event: event["event"] == "published" and len(event["cids"]) == 12, "12 adds")
            assert large["bytes"] > 256 * 1024
            check_applied(nodes, large["cids"], ready["did"])
            total = len(made) + len(big) + 1 + 12
            wait_until(lambda: converged(nodes, total), "equal state roots with the JS peer's operations")
            # n2 took them by gossip (the JS peer serves no sync), and holds nothing against the JS peer
            record = js_peer_record(n2, ready["peer_id"])
            assert record is not None and record["operations_received"] == 13 and record["gossip_messages"] >= 2, record
            assert record["invalid"] == 0 and record["banned_for"] == 0, record

            # a JS operation whose signature is off by one bit: n2 refuses it, blames the JS peer, forwards nothing
            js.send({"cmd": "publish", "contents": [{**JS_CONTENT, "embedding": embedding}], "tamper": True})
            forged = js.wait_for(lambda event: event["event"] == "published" and event["tampered"], "the forgery")
            wait_until(lambda: js_peer_record(n2, ready["peer_id"])["invalid"] == 1, "n2 to count the forgery")
            assert not any(has(node, forged["cids"][0]) for node in nodes)
            assert converged(nodes, total)
