"""The HTTP face's POST / endpoint through its ASGI interface: the answers the daemon tests cannot provoke over the
wire (a stopping node, a failure inside dispatch, a client gone before its body arrived)."""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio

from node.events import EventHub
from node.jsonrpc import Dispatcher
from node.metrics import NodeMetrics
from node.server import ServerState, build_app

TOKEN = "secret"
CALL = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "echo", "params": {"value": 1}}).encode()


def _state(dispatcher: Dispatcher) -> ServerState:
    metrics = NodeMetrics()
    return ServerState([TOKEN], dispatcher, EventHub(metrics), metrics)


def _echo() -> tuple[Dispatcher, list[Any]]:
    dispatcher, seen = Dispatcher(), []

    @dispatcher.method("echo")
    async def echo(value: Any) -> Any:
        seen.append(value)
        return value

    return dispatcher, seen


def _post(
    state: ServerState, chunks: list[bytes], sent: list[dict[str, Any]] | None = None, *, then_disconnect: bool = False
) -> list[dict[str, Any]]:
    """POST / with the body in `chunks` as an ASGI server delivers it; the messages the app sent back (into `sent`)."""
    scope = {
        "type": "http",
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/",
        "raw_path": b"/",
        "query_string": b"",
        "root_path": "",
        "headers": [(b"authorization", f"Bearer {TOKEN}".encode())],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8000),
    }
    incoming: list[dict[str, Any]] = [
        {"type": "http.request", "body": chunk, "more_body": then_disconnect or index < len(chunks) - 1}
        for index, chunk in enumerate(chunks)
    ]
    if then_disconnect:
        incoming.append({"type": "http.disconnect"})
    sent = [] if sent is None else sent

    async def receive() -> dict[str, Any]:
        await trio.lowlevel.checkpoint()
        return incoming.pop(0)

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    trio.run(build_app(state, max_body_bytes=1024), scope, receive, send)
    return sent


def _status_and_body(sent: list[dict[str, Any]]) -> tuple[int, bytes]:
    assert [message["type"] for message in sent] == ["http.response.start", "http.response.body"]
    return sent[0]["status"], sent[1]["body"]


def test_a_call_split_over_chunks_is_answered_with_its_length():
    dispatcher, seen = _echo()
    sent = _post(_state(dispatcher), [CALL[:10], CALL[10:]])
    status, body = _status_and_body(sent)
    assert status == 200 and json.loads(body) == {"jsonrpc": "2.0", "id": 1, "result": 1} and seen == [1]
    assert dict(sent[0]["headers"]) == {
        b"content-length": str(len(body)).encode(),
        b"content-type": b"application/json",
    }


def test_a_stopping_node_answers_503_and_dispatches_nothing():
    dispatcher, seen = _echo()
    state = _state(dispatcher)
    state.stopping.set()
    status, body = _status_and_body(_post(state, [CALL]))
    assert (status, json.loads(body), seen) == (503, {"error": "the node is stopping"}, [])


def test_a_failure_inside_dispatch_answers_500_and_reaches_the_server_that_logs_it():
    dispatcher = Dispatcher()

    @dispatcher.method("echo")
    async def echo(value: Any) -> Any:
        return object()  # a result JSON cannot encode: the dispatcher itself fails, outside any method

    sent: list[dict[str, Any]] = []
    with pytest.raises(TypeError):  # the ASGI server gets the error, and logs it
        _post(_state(dispatcher), [CALL], sent)
    assert _status_and_body(sent) == (500, b"Internal Server Error")


def test_a_client_gone_before_its_body_is_complete_gets_no_answer_and_nothing_is_dispatched():
    dispatcher, seen = _echo()
    assert _post(_state(dispatcher), [CALL[:10]], then_disconnect=True) == []
    assert seen == []


def test_events_published_after_the_hub_closed_reach_nobody_and_raise_nothing():
    """At stop the hub closes before the ingest task drains its queue; a batch committed then used to end the
    daemon with ClosedResourceError from a subscriber's closed channel (seen stopping a flooded node)."""
    hub = EventHub(NodeMetrics())
    with hub.subscribe() as subscription:
        hub.publish("operation", {"n": 1})
        hub.close()
        assert not hub.listening
        hub.publish("operation", {"n": 2})
        assert [event["data"] for event in _drain(subscription)] == [{"n": 1}]


def _drain(subscription) -> list[dict]:
    events = []
    while True:
        try:
            events.append(subscription.receive.receive_nowait())
        except (trio.WouldBlock, trio.EndOfChannel):
            return events
