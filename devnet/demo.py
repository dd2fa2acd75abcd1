"""`expledger devnet demo`: a seed library loaded through different nodes, a conflict, a near-duplicate,
convergence, then retrieval and the context-injection prompt read from a node that never received the
experience it returns.

Every operation is built and signed here with the ledger's own code (as `expledger op new` does) and
submitted over RPC. The authors' keys come from fixed seeds and every operation carries the same
`created` time, so the operations are the same bytes on every run: running the demo again on the same
devnet submits nothing new (the nodes answer "duplicate") and changes nothing.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from devnet.network import WAIT_TIMEOUT, Devnet, DevnetError, NodeSpec
from ledger.embedder import embedder_for
from ledger.jsonview import experience_from_json
from ledger.keys import AuthorKey
from ledger.ops import Block, Kind, Operation, sign
from ledger.params import NetworkParams
from ledger.validation import examine
from node.client import DaemonUnavailable, RpcFailed, render

LIBRARY = Path(__file__).with_name("library.json")
RETRIEVE_K = 3


@dataclass(frozen=True)
class Plan:
    """The demo's signed operations: the seed library's adds (by tag), the conflict and the near-duplicate."""

    adds: dict[str, Block]
    modify: Block
    delete: Block
    near_duplicate: Block
    library: dict[str, Any]

    @property
    def conflict_target(self) -> Block:
        return self.adds[self.library["conflict"]["target"]]

    @property
    def duplicated(self) -> Block:
        return self.adds[self.library["near_duplicate"]["of"]]


def load_library(path: Path = LIBRARY) -> dict[str, Any]:
    return json.loads(path.read_text())


def author_key(name: str) -> AuthorKey:
    """A demo author's key: a fixed seed, so the demo's operations are the same bytes on every run."""
    return AuthorKey(hashlib.sha256(f"expledger-devnet-demo/{name}".encode()).digest())


def build(params: NetworkParams, library: dict[str, Any] | None = None) -> Plan:
    """Sign every operation of the demo and check each as a node will; refuse the library if one is invalid."""
    library = library or load_library()
    embedder = embedder_for(params)
    authors = [author_key(name) for name in library["authors"]]
    created = library["created"]

    def content(entry: dict[str, Any]) -> Any:
        view = {key: entry[key] for key in ("text", "domain", "confidence")}
        view["examples"] = entry.get("examples", [])
        view["metadata"] = {"source": entry.get("source", "devnet-demo")}
        return experience_from_json(view, embedder)

    def signed(op: Operation, key: AuthorKey, what: str) -> Block:
        block = sign(op, key)
        _, errors = examine(block.data, params)
        if errors:
            raise DevnetError("demo.library", f"{what}: {errors[0].code}: {errors[0].message}")
        return block

    adds = {}
    for index, entry in enumerate(library["experiences"]):
        key = authors[index % len(authors)]
        op = Operation(Kind.ADD, key.did, 1, (), created, content=content(entry))
        adds[entry["tag"]] = signed(op, key, f"experience {entry['tag']}")
    conflict = library["conflict"]
    target = adds[conflict["target"]]
    # the modify and the delete both build on the add alone: neither author has seen the other's operation
    modify = signed(
        Operation(Kind.MODIFY, authors[1].did, 2, (target.cid,), created, content(conflict["modify"]), target.cid),
        authors[1],
        "the conflict's modify",
    )
    delete = signed(
        Operation(
            Kind.DELETE, authors[2].did, 2, (target.cid,), created, target=target.cid, reason=conflict["delete_reason"]
        ),
        authors[2],
        "the conflict's delete",
    )
    # clock 2 without parents: it sorts after the experience it nearly duplicates, so it is the one absorbed
    near = library["near_duplicate"]
    near_duplicate = signed(
        Operation(Kind.ADD, authors[1].did, 2, (), created, content=content(near)), authors[1], "the near-duplicate"
    )
    return Plan(adds, modify, delete, near_duplicate, library)


def submit(node: NodeSpec, block: Block) -> dict[str, Any]:
    try:
        return node.client().call("submit", operation=block.data.hex())
    except (DaemonUnavailable, RpcFailed) as exc:
        message = f"{node.name} did not take operation {block.cid}: {exc.code}: {exc.message}"
        raise DevnetError("demo.submit", message) from None


def ask(node: NodeSpec, method: str) -> dict[str, Any]:
    """A read-only call the demo waits on; a node that stops answering ends the demo with a clear error."""
    try:
        return node.client().call(method)
    except (DaemonUnavailable, RpcFailed) as exc:
        raise DevnetError("demo.node", f"{node.name} stopped answering: {exc.code}: {exc.message}") from None


def wait_converged(nodes: list[NodeSpec], say: Callable[[str], None], timeout: float = WAIT_TIMEOUT) -> str:
    """Wait until every node has the same state root (the same set of operations, so each holds everything
    any of them was given) and says it is in sync (nothing it found missing is still on its way). Returns the
    root."""
    started = time.monotonic()
    while True:
        states = {}
        for node in nodes:
            answer = ask(node, "state_root")
            states[node.name] = (answer["state_root"], answer["log_size"])
        if len(set(states.values())) == 1 and all(
            ask(node, "status")["p2p"]["sync"]["state"] == "in sync" for node in nodes
        ):
            root, size = next(iter(states.values()))
            say(f"  converged in {time.monotonic() - started:.1f} s: {size} operations, state root {root[:16]}… on all")
            return root
        if time.monotonic() - started > timeout:
            shown = ", ".join(f"{name} {size} ops {root[:8]}" for name, (root, size) in states.items())
            raise DevnetError("demo.timeout", f"no convergence within {timeout:.0f} s: {shown}")
        time.sleep(0.2)


def wait_embedded(node: NodeSpec, say: Callable[[str], None], timeout: float = WAIT_TIMEOUT) -> str:
    """Wait until `node`'s retrieval model has embedded every live experience (status `retrieval.missing`);
    the model's name.

    The daemon embeds new experiences on a background task, and a query ranks by the network's
    embedding those it has not reached yet: retrieval read before then answers with other scores
    than the same query a moment later."""
    started = time.monotonic()
    while True:
        retrieval = ask(node, "status")["retrieval"]
        if retrieval["missing"] == 0:
            say(f"  {node.name} ranks all {retrieval['live']} live experiences with {retrieval['model']}")
            return retrieval["model"]
        if time.monotonic() - started > timeout:
            missing = retrieval["missing"]
            raise DevnetError("demo.timeout", f"{node.name} still lacks {missing} vectors after {timeout:.0f} s")
        time.sleep(0.2)


#: the numbered steps `run` prints (== 1. to == 6.); the devnet CLI prints the status table as the next one
STEPS = 6


def run(devnet: Devnet, say: Callable[[str], None]) -> dict[str, Any]:
    """The whole demo on a running devnet of two or more nodes; returns the CIDs and nodes it used."""
    nodes = devnet.nodes
    if len(nodes) < 2:
        raise DevnetError("demo.nodes", "the demo needs a devnet of 2 nodes or more (`up --nodes 3`)", 2)
    stopped = [node.name for node in nodes if node.state() != "running"]
    if stopped:
        raise DevnetError("demo.stopped", f"not running: {', '.join(stopped)}; `expledger devnet up` starts them")
    params = NetworkParams.from_file(devnet.network_file)
    say("building and signing the demo's operations (WordLlama embeds each experience)")
    plan = build(params)
    library = plan.library
    tags = list(plan.adds)
    receiver = {tag: nodes[index % len(nodes)] for index, tag in enumerate(tags)}

    say(f"\n== 1. a seed library: {len(tags)} experiences by {', '.join(library['authors'])}, one node after another")
    outcomes: dict[str, Counter[str]] = {node.name: Counter() for node in nodes}
    for tag in tags:
        receipt = submit(receiver[tag], plan.adds[tag])
        outcomes[receiver[tag].name][receipt["outcome"]] += 1
    for name, counted in outcomes.items():
        say(f"  {name} took {', '.join(f'{count} {outcome}' for outcome, count in sorted(counted.items()))}")
    wait_converged(nodes, say)

    target = plan.conflict_target
    modify_node, delete_node, near_node = nodes[1 % len(nodes)], nodes[2 % len(nodes)], nodes[1 % len(nodes)]
    say("\n== 2. a concurrent modify and delete of one experience, through two nodes at once")
    say(f'  "{library["experiences"][tags.index(library["conflict"]["target"])]["text"]}"')
    receipts: dict[str, dict[str, Any]] = {}
    errors: list[DevnetError] = []

    def send(label: str, node: NodeSpec, block: Block) -> None:
        try:
            receipts[label] = submit(node, block)
        except DevnetError as exc:
            errors.append(exc)

    threads = [
        threading.Thread(target=send, args=("modify", modify_node, plan.modify)),
        threading.Thread(target=send, args=("delete", delete_node, plan.delete)),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    for label, node in (("modify", modify_node), ("delete", delete_node)):
        receipt = receipts[label]
        code = f" ({receipt['code']})" if receipt["code"] else ""
        say(f"  {node.name} <- {label}: {receipt['outcome']}{code}")

    duplicated = plan.duplicated
    say(f"\n== 3. a near-duplicate of {library['near_duplicate']['of']} added through {near_node.name}")
    say(f'  "{library["near_duplicate"]["text"]}"')
    receipt = submit(near_node, plan.near_duplicate)
    into = receipt["status"].get("into")
    say(f"  {near_node.name}: {receipt['outcome']}" + (f" into {into}" if into else ""))
    wait_converged(nodes, say)

    say("\n== 4. the same verdicts on every node (PROTOCOL §7.4: delete beats modify; a near-duplicate is absorbed)")
    for node in nodes:
        client = node.client()
        conflict = client.call("get", id=str(target.cid))["library"]
        history = client.call("history", id=str(target.cid))["operations"]
        modified = next(op["status"] for op in history if op["cid"] == str(plan.modify.cid))
        original = client.call("get", id=str(duplicated.cid))["library"]
        say(
            f"  {node.name}: {library['conflict']['target']} {conflict['status']} (the modify: {modified['outcome']}, "
            f"{modified.get('code')}); {library['near_duplicate']['of']} {original['status']} with support "
            f"{original['support']}"
        )
        if conflict["status"] != "deleted" or original["support"] != 2 or original["status"] != "live":
            raise DevnetError("demo.rules", f"{node.name} does not hold the verdicts the protocol requires")

    reader = next(node for node in reversed(nodes) if node is not receiver[library["near_duplicate"]["of"]])
    problem = library["problem"]
    say(
        f"\n== 5. retrieval on {reader.name} (the seed experience {library['near_duplicate']['of']} was submitted "
        f"through {receiver[library['near_duplicate']['of']].name})"
    )
    model = wait_embedded(reader, say)
    if model != params.embedding_model:
        say(
            f"  why two embedders: every operation carries a WordLlama vector ({params.embedding_model}), the "
            "network's consensus embedding, cheap enough for every node to re-check on every operation it receives; "
            f"{model} is a better retrieval model that each node runs for itself to rank what a query finds"
        )
    say(f"  problem: {problem}")
    hits = reader.client().call("retrieve", query=problem, k=RETRIEVE_K)
    say(render("retrieve", hits))
    say(f"\n== 6. the context-injection prompt from {reader.name}")
    prompt = reader.client().call("context", query=problem, k=RETRIEVE_K)
    say(render("context", prompt))
    return {
        "experiences": {tag: str(block.cid) for tag, block in plan.adds.items()},
        "receivers": {tag: node.name for tag, node in receiver.items()},
        "reader": reader.name,
        "top_hit": hits["hits"][0]["id"] if hits["hits"] else None,
    }
