"""The curator: two real daemons syncing over libp2p, one of them curating with a (fake) OpenAI-compatible model.
Concurrent modifies made on the two nodes leave the experience conflicted until the curator's modify, built on
every head, resolves it on both; paraphrases the model calls the same strategy are merged, others kept apart,
and nothing is asked twice."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from ledger.cid import CID
from ledger.embedder import embedder_for
from ledger.jsonview import experience_from_json
from ledger.keys import AuthorKey
from ledger.ops import Kind, Operation, sign
from ledger.params import NetworkParams
from tests.daemons import Daemon, log_lines, start
from tests.dso_fakes import Reply, fake_llm, stage
from tests.test_network import addr, converged, has, network, state, wait_until

LEMMA = "When a proof uses a lemma, state the lemma's conditions and check each one."
VERSION_A = "When a proof uses a lemma, state its conditions and check each one on the case at hand."
VERSION_B = "When a proof uses a lemma, verify each of its hypotheses before applying it."
RECONCILED = "When a proof uses a lemma, verify each of its hypotheses on the case at hand before applying it."
SEGMENTS = (
    "When intersecting lines with segments, check each solution lies on the segment.",
    "When lines meet segments, verify that every solution lies on the segment itself.",
)
SPEEDS = (
    "When computing an average speed, divide total distance by total time.",
    "When finding average speed, divide the whole distance by the whole time taken.",
)
MERGED = "When lines meet segments, check that each solution lies on the segment, not on its extension."


def curator_config(url: str) -> str:
    return f"""
[llm]
base_url = "{url}"
model = "fake-model"
curate = true
curate_interval = 1
curate_similarity = 0.8
curate_calls_per_minute = 600
"""


def model(request: dict[str, Any]) -> Reply:
    prompt = request["messages"][-1]["content"]
    if stage(request) == "reconcile":
        return Reply(json.dumps({"experience": RECONCILED}))
    if stage(request) == "same":
        if "segment" in prompt:
            return Reply(json.dumps({"same": True, "experience": MERGED, "reason": "both: stay on the segment"}))
        return Reply(json.dumps({"same": False, "reason": "one is about rates"}))
    return Reply("{}")


def concurrent_modify(node: Daemon, exp_id: str, text: str, params: NetworkParams) -> dict[str, Any]:
    """A modify by a fresh author built on the experience's creation alone: concurrent with any other such."""
    key, created = AuthorKey.generate(), node.call("get", {"id": exp_id})["library"]["clock"]
    content = experience_from_json({"text": text, "domain": "math.logic", "confidence": 0.7}, embedder_for(params))
    target = CID.parse(exp_id)
    op = Operation(Kind.MODIFY, key.did, created + 1, (target,), int(time.time()), content=content, target=target)
    return node.call("submit", {"operation": sign(op, key).data.hex()})


def passes(home: Path) -> int:
    return sum(line["message"].startswith("curator: pass ") for line in log_lines(home))


def test_a_curator_resolves_a_concurrent_modify_and_merges_paraphrases(tmp_path: Path) -> None:
    with fake_llm(model) as llm, network(tmp_path) as net:
        a = net.start("a")
        home_b = net.home("b", (addr(a),))
        config = home_b / "config.toml"
        config.write_text(config.read_text() + curator_config(llm.url))
        b = start(home_b, "--log-level", "debug")
        net.stack.callback(b.stop)
        params = NetworkParams.from_file(net.genesis)
        wait_until(lambda: b.call("status")["p2p"]["sync"]["peers"] == 1, "b connected to a")

        lemma = a.call("add", {"text": LEMMA, "domain": "math.logic", "confidence": 0.6})["cid"]
        wait_until(lambda: has(b, lemma), "the experience on b")
        first = concurrent_modify(a, lemma, VERSION_A, params)
        second = concurrent_modify(b, lemma, VERSION_B, params)
        assert first["outcome"] == second["outcome"] == "applied"

        def settled(node: Daemon) -> bool:
            library = node.call("get", {"id": lemma})["library"]
            return len(library["heads"]) == 1 and library["heads"][0] not in (first["cid"], second["cid"])

        for node in (a, b):
            wait_until(lambda node=node: settled(node), f"the conflict resolved on {node.home.name}")
        for node in (a, b):
            shown = node.call("get", {"id": lemma})
            assert shown["text"] == RECONCILED and shown["library"]["conflicted"] is False
            assert shown["metadata"]["created_by"] == b.call("status")["author"]
            assert shown["metadata"]["source"] == "curator model=fake-model"
        resolution = b.call("get", {"id": lemma})["library"]["version"]
        history = {op["cid"]: op for op in b.call("history", {"id": lemma})["operations"]}
        assert history[resolution]["kind"] == "modify"
        assert history[first["cid"]]["status"]["outcome"] == history[second["cid"]]["status"]["outcome"] == "superseded"

        segments = [
            a.call("add", {"text": text, "domain": "math.geometry", "confidence": 0.7})["cid"] for text in SEGMENTS
        ]
        speeds = [
            a.call("add", {"text": text, "domain": "math.arithmetic", "confidence": 0.7})["cid"] for text in SPEEDS
        ]

        def merged(node: Daemon) -> bool:
            records = [node.call("get", {"id": cid})["library"] for cid in segments if has(node, cid)]
            return len(records) == 2 and all(record["status"] == "alias" for record in records)

        for node in (a, b):
            wait_until(lambda node=node: merged(node), f"the paraphrases merged on {node.home.name}")
        merge = b.call("get", {"id": b.call("get", {"id": segments[0]})["library"]["alias_of"]})
        assert merge["text"] == MERGED and merge["library"]["support"] == 2
        wait_until(lambda: all(has(a, cid) and has(b, cid) for cid in speeds), "the other pair everywhere")

        # later passes ask nothing again: one reconcile, one question per pair
        seen = passes(home_b)
        wait_until(lambda: passes(home_b) >= seen + 3, "three more curation passes")
        for cid in speeds:
            assert b.call("get", {"id": cid})["library"]["status"] == "live"  # not the same strategy: kept apart
        asked = [stage(request) for request in llm.requests]
        assert asked.count("reconcile") == 1
        assert len(llm.prompts("state the same strategy")) == 2
        wait_until(lambda: converged([a, b], state(b)[1]), "equal state roots")
        # the curator's operations are gossiped as they are made, like an RPC client's: its modify and merge, and
        # b's own submitted modify (a has them at once, not at its next sync round)
        assert b.call("peers")["self"]["counters"]["operations_gossiped"] == 3
        decisions = [line["message"] for line in log_lines(home_b) if line["logger"] == "expledger.curator"]
        assert any("resolved by modify" in line for line in decisions)
        assert any("not the same strategy" in line for line in decisions)
        assert any("merged into" in line for line in decisions)
