"""The JSON-RPC dispatcher and the node's error mapping, in one process (the daemon tests cover HTTP):
a bug in a method is -32603 and logged, a stopping node is -32004, a full queue -32003."""

from __future__ import annotations

import json
import logging

import trio

from ledger.ingest import Source, Submission
from node import api
from node.config import Config, IngestConfig
from node.events import EventHub
from node.jsonrpc import BUSY, INTERNAL_ERROR, STOPPING, Dispatcher
from node.metrics import NodeMetrics
from node.service import Busy, Node
from tests import factories as f
from tests.ledgers import open_ledger


def _call(method: str, params: dict | None = None) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params or {}}).encode()


def test_a_method_that_fails_is_an_internal_error_and_is_logged(caplog):
    dispatcher = Dispatcher()

    @dispatcher.method("broken")
    async def broken() -> None:
        raise RuntimeError("a bug")

    answer = json.loads(trio.run(dispatcher.handle, _call("broken")))
    assert answer["error"] == {"code": INTERNAL_ERROR, "message": "internal error"}
    assert any(
        "rpc method broken failed" in record.message for record in caplog.records if record.levelno == logging.ERROR
    )


def _node(tmp_path, queue: int = 10) -> tuple[Node, Dispatcher, trio.Event]:
    ledger = open_ledger(tmp_path / "node")
    metrics = NodeMetrics()
    config = Config(ingest=IngestConfig(queue=queue, batch=10))
    node = Node(ledger, f.author(3), config, metrics, EventHub(metrics))
    dispatcher, stop = Dispatcher(observer=metrics), trio.Event()
    api.register(dispatcher, node, stop)
    return node, dispatcher, stop


def test_a_submission_to_a_stopping_node_is_refused_with_its_code(tmp_path):
    node, dispatcher, _ = _node(tmp_path)

    async def main() -> dict:
        node.close_queue()  # what the daemon does once the HTTP server has drained
        return json.loads(await dispatcher.handle(_call("submit", {"operation": f.add().data.hex()})))

    answer = trio.run(main)
    assert answer["error"]["code"] == STOPPING and answer["error"]["data"]["code"] == "node.stopping"
    node.ledger.close()


def test_a_full_queue_refuses_at_once_and_counts_it(tmp_path):
    node, dispatcher, _ = _node(tmp_path, queue=1)
    block = f.add()

    async def main() -> tuple[dict, float]:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(node.submit, Submission(block.data, Source("rpc")))  # fills the queue: nobody drains
            while node.queued() == 0:
                await trio.sleep(0)
            answer = json.loads(
                await dispatcher.handle(_call("submit", {"operation": f.add(f.SEED_TEXTS[1]).data.hex()}))
            )
            nursery.start_soon(node.run_ingest)  # now drain, so the first submission completes
            while node.ledger.view().log_size < 1:
                await trio.sleep(0.01)
            node.close_queue()
            return answer, node.metrics.registry.get_sample_value("expledger_ingest_refused_total")

    answer, refused = trio.run(main)
    assert answer["error"]["code"] == BUSY and answer["error"]["data"]["code"] == "ingest.busy"
    assert refused == 1
    node.ledger.close()


def test_busy_is_raised_before_anything_is_queued(tmp_path):
    node, _, _ = _node(tmp_path, queue=1)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(node.submit, Submission(f.add().data))
            while node.queued() == 0:
                await trio.sleep(0)
            try:
                await node.submit(Submission(f.add(f.SEED_TEXTS[1]).data))
            except Busy:
                assert node.queued() == 1
            else:
                raise AssertionError("a full queue took a submission")
            nursery.start_soon(node.run_ingest)
            while node.ledger.view().log_size < 1:
                await trio.sleep(0.01)
            node.close_queue()

    trio.run(main)
    assert node.ledger.view().log_size == 1
    node.ledger.close()
