"""The JSON-RPC dispatcher and the node's error mapping, in one process (the daemon tests cover HTTP):
a bug in a method is -32603 and logged, a stopping node is -32004, a full queue -32003; an error message repeats at
most ECHO_CHARS characters of what the client sent."""

from __future__ import annotations

import json
import logging

import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from ledger.ingest import Source, Submission
from node import api
from node.config import Config, IngestConfig
from node.events import EventHub
from node.jsonrpc import (
    BUSY,
    ECHO_CHARS,
    INTERNAL_ERROR,
    INTERNAL_MESSAGE,
    INVALID_PARAMS,
    MAX_MESSAGE_CHARS,
    METHOD_NOT_FOUND,
    STOPPING,
    Dispatcher,
    RpcError,
)
from node.metrics import NodeMetrics
from node.service import Busy, Node
from tests import factories as f
from tests.ledgers import open_ledger


def _call(method: str, params: dict | None = None) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params or {}}).encode()


def test_a_method_that_fails_is_an_internal_error_that_names_the_condition_and_the_detail_is_logged(caplog):
    dispatcher = Dispatcher()

    @dispatcher.method("broken")
    async def broken() -> None:
        raise OSError(28, "No space left on device", "/home/someone/.expledger/data/secret.log")

    answer = json.loads(trio.run(dispatcher.handle, _call("broken")))
    assert answer["error"] == {"code": INTERNAL_ERROR, "message": INTERNAL_MESSAGE, "data": {"code": "rpc.internal"}}
    logged = [record for record in caplog.records if record.levelno == logging.ERROR]
    assert any("rpc method broken failed" in record.message and "secret.log" in record.exc_text for record in logged)


def _echoing_dispatcher() -> Dispatcher:
    dispatcher = Dispatcher()

    @dispatcher.method("echo")
    async def echo(value: object) -> object:
        return value

    @dispatcher.method("loud")
    async def loud(value: str) -> None:
        raise RpcError(INVALID_PARAMS, f"value: {value} is not acceptable", {"code": "params.range", "message": value})

    return dispatcher


def test_a_100_kb_method_name_is_not_echoed_back_whole():
    name = "m" * 100_000
    answer = json.loads(trio.run(_echoing_dispatcher().handle, _call(name)))
    error = answer["error"]
    assert (error["code"], error["data"]["code"]) == (METHOD_NOT_FOUND, "rpc.method_not_found")
    assert error["message"] == f"method not found: {'m' * ECHO_CHARS}… (100000 characters)"


def test_a_100_kb_parameter_name_is_not_echoed_back_whole_and_the_method_says_what_it_takes():
    answer = json.loads(trio.run(_echoing_dispatcher().handle, _call("echo", {"value": 1, "p" * 100_000: 2})))
    error = answer["error"]
    assert (error["code"], error["data"]["code"]) == (INVALID_PARAMS, "params.shape")
    assert error["message"] == f"unknown parameter: {'p' * ECHO_CHARS}… (100000 characters); echo takes value"


@settings(max_examples=100, deadline=None)
@given(
    method=st.sampled_from(["echo", "loud", "nothing"]),
    key=st.text(max_size=3000),
    value=st.one_of(st.text(max_size=3000), st.integers(), st.lists(st.text(max_size=300), max_size=20)),
)
def test_no_error_message_is_longer_than_the_limit_whatever_the_client_sends(method, key, value):
    answer = json.loads(trio.run(_echoing_dispatcher().handle, _call(method, {"value": value, key: value})))
    if "error" in answer:
        error = answer["error"]
        assert len(error["message"]) <= MAX_MESSAGE_CHARS + 30, error["message"]  # the clip says the length
        assert len(error.get("data", {}).get("message", "")) <= MAX_MESSAGE_CHARS + 30


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


def test_the_methods_quote_at_most_a_hundred_characters_of_a_bad_value(tmp_path):
    node, dispatcher, _ = _node(tmp_path)
    huge_number = 10**4000
    calls = [
        ("get", {"id": "b" * 100_000}, "id: longer than 100 characters"),
        ("submit", {"operation": "00", "encoding": "x" * 100_000}, "encoding: 'xxxxx"),
        ("retrieve", {"query": "q", "k": huge_number}, f"k: {str(huge_number)[:ECHO_CHARS]}… (4001 characters) is"),
        ("add", {"text": "t", "domain": "d", "confidence": 0.5, "examples": [{"k" * 100_000: 1}]}, "examples[0].kkk"),
    ]
    for method, params, start in calls:
        body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).encode()
        error = json.loads(trio.run(dispatcher.handle, body))["error"]
        assert error["code"] == INVALID_PARAMS and error["message"].startswith(start), error
        assert len(error["message"]) < ECHO_CHARS + 100, error
    number = "9" * 3000  # within the text limit, and far beyond what a message should quote
    text = f"When a count reaches {number}, split the work into batches."

    async def add_through_ingest() -> bytes | None:
        async with trio.open_nursery() as nursery:
            await nursery.start(node.run_ingest)
            answer = await dispatcher.handle(_call("add", {"text": text, "domain": "math", "confidence": 0.5}))
            node.close_queue()
        return answer

    error = json.loads(trio.run(add_through_ingest))["error"]
    assert error["data"]["code"] == "text.generality.number"
    assert all(len(found["message"]) < 150 for found in error["data"]["errors"]) and len(error["message"]) < 200
    node.ledger.close()
