"""The node's HTTP server over real loopback connections: what the daemon tests cannot provoke through httpx
(pipelining, a body refused before it is read, malformed requests, timeouts, a drain with a request in flight,
websocket handshakes) and the routes' answers (a stopping node, a failure inside dispatch)."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import trio
from hypothesis import given, settings
from hypothesis import strategies as st
from wsproto.connection import Connection as WsConnection
from wsproto.connection import ConnectionType
from wsproto.events import CloseConnection, Ping, Pong, TextMessage

from node.events import EventHub
from node.httpserver import WS_GUID, HttpServer
from node.jsonrpc import Dispatcher
from node.metrics import NodeMetrics
from node.server import NodeRoutes, ServerState

TOKEN = "secret"
AUTH = f"Authorization: Bearer {TOKEN}\r\n".encode()
CALL = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "echo", "params": {"value": 1}}).encode()
LIMIT = 1024
WAIT = 10  # seconds any one exchange may take before the test fails (never reached when the server is right)


def _post(body: bytes | str, *extra: bytes) -> bytes:
    body = body.encode() if isinstance(body, str) else body
    return b"POST / HTTP/1.1\r\nHost: x\r\n" + AUTH + b"".join(extra) + b"Content-Length: %d\r\n\r\n" % len(body) + body


class Node:
    """A server on a free port with an echo method whose calls can be held until released."""

    def __init__(self) -> None:
        self.metrics = NodeMetrics()
        self.dispatcher = Dispatcher()
        self.state = ServerState([TOKEN], self.dispatcher, EventHub(self.metrics), self.metrics)
        self.seen: list[Any] = []
        self.release = trio.Event()
        self.release.set()
        self.held = trio.Event()
        self.drain = trio.Event()
        self.refused: list[str] = []
        self.port = 0

        @self.dispatcher.method("echo")
        async def echo(value: Any) -> Any:
            self.held.set()
            await self.release.wait()
            self.seen.append(value)
            return value

        @self.dispatcher.method("broken")
        async def broken() -> Any:
            return object()  # a result JSON cannot encode: the dispatcher itself fails, outside any method

    async def connect(self) -> trio.SocketStream:
        return await trio.open_tcp_stream("127.0.0.1", self.port)


@asynccontextmanager
async def serving(**options: Any) -> AsyncIterator[Node]:
    node = Node()
    routes = NodeRoutes(node.state)
    settings = {"max_body": LIMIT, "idle_timeout": 30.0, "graceful_timeout": 5.0, **options}
    server = HttpServer(
        routes.handle, routes.websocket, holds_token=routes.holds_token, refused=node.refused.append, **settings
    )
    listener = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]
    node.port = listener.socket.getsockname()[1]
    async with trio.open_nursery() as nursery:
        await nursery.start(server.serve, listener, node.drain)
        with trio.fail_after(WAIT):
            yield node
        node.drain.set()


class Reader:
    """Reads HTTP/1.1 answers (with Content-Length, or none: 204 and 1xx) from one connection."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.buffer = b""

    async def _fill(self) -> bool:
        data = await self.stream.receive_some(65536)
        self.buffer += data
        return bool(data)

    async def answer(self, *, head: bool = False) -> tuple[int, dict[str, str], bytes]:
        while b"\r\n\r\n" not in self.buffer:
            assert await self._fill(), f"the connection closed mid-answer: {self.buffer!r}"
        top, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
        status_line, *lines = top.decode("latin-1").split("\r\n")
        headers = {name.lower(): value.strip() for name, _, value in (line.partition(":") for line in lines)}
        length = 0 if head else int(headers.get("content-length", "0"))
        while len(self.buffer) < length:
            assert await self._fill(), "the connection closed mid-body"
        body, self.buffer = self.buffer[:length], self.buffer[length:]
        return int(status_line.split()[1]), headers, body

    async def closed(self) -> bool:
        """True once the server has closed the connection (having sent nothing more); the client then closes its
        end, as a client told `connection: close` does, which ends the server's lingering drain of it."""
        closed = not await self._fill() and not self.buffer
        if closed:
            await self.stream.aclose()
        return closed


async def exchange(node: Node, request: bytes) -> tuple[int, dict[str, str], bytes]:
    """One request on a new connection, closed after the answer."""
    async with await node.connect() as stream:
        await stream.send_all(request)
        return await Reader(stream).answer()


def test_calls_on_one_connection_pipelined_or_not_are_answered_in_order():
    async def main() -> None:
        async with serving() as node:
            stream = await node.connect()
            reader = Reader(stream)
            calls = [json.dumps({"jsonrpc": "2.0", "id": i, "method": "echo", "params": [i]}) for i in range(4)]
            await stream.send_all(_post(calls[0]))
            assert json.loads((await reader.answer())[2])["result"] == 0
            await stream.send_all(_post(calls[1]) + _post(calls[2]) + _post(calls[3]))  # in one segment
            assert [json.loads((await reader.answer())[2])["result"] for _ in range(3)] == [1, 2, 3]
            assert node.seen == [0, 1, 2, 3]

    trio.run(main)


def test_a_body_split_over_segments_and_a_chunked_body_are_read_whole():
    async def main() -> None:
        async with serving() as node:
            stream = await node.connect()
            request = _post(CALL)
            for index in range(0, len(request), 7):
                await stream.send_all(request[index : index + 7])
            status, headers, body = await Reader(stream).answer()
            assert (status, json.loads(body)) == (200, {"jsonrpc": "2.0", "id": 1, "result": 1})
            assert headers["content-type"] == "application/json" and headers["content-length"] == str(len(body))
            chunked = b"POST / HTTP/1.1\r\nHost: x\r\n" + AUTH + b"Transfer-Encoding: chunked\r\n\r\n"
            chunked += b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in (CALL[:9], CALL[9:])) + b"0\r\n\r\n"
            assert json.loads((await exchange(node, chunked))[2])["result"] == 1

    trio.run(main)


def test_a_declared_body_over_the_limit_is_refused_before_it_is_sent():
    async def main() -> None:
        async with serving() as node:
            stream = await node.connect()
            head = b"POST / HTTP/1.1\r\nHost: x\r\n" + AUTH + b"Content-Length: %d\r\n\r\n" % (LIMIT + 1)
            await stream.send_all(head)  # and not one byte of the body
            reader = Reader(stream)
            status, headers, body = await reader.answer()
            assert (status, headers["connection"]) == (413, "close") and str(LIMIT).encode() in body
            await stream.send_all(b"x" * (LIMIT + 1))  # what the client sends meanwhile is read and dropped
            assert await reader.closed()
            assert node.seen == [] and node.refused == ["too_large"]

    trio.run(main)


def test_calls_pipelined_before_a_refused_one_are_answered_first_and_nothing_after_it():
    async def main() -> None:
        async with serving() as node:
            stream = await node.connect()
            too_large = b"POST / HTTP/1.1\r\nHost: x\r\n" + AUTH + b"Content-Length: %d\r\n\r\n" % (LIMIT + 1)
            await stream.send_all(_post(CALL) + too_large + b" " * (LIMIT + 1) + _post(CALL))
            reader = Reader(stream)
            status, headers, body = await reader.answer()
            assert (status, json.loads(body)["result"]) == (200, 1) and "connection" not in headers
            assert (await reader.answer())[0] == 413 and await reader.closed()
            assert node.seen == [1]

    trio.run(main)


def test_a_chunked_body_is_refused_once_it_passes_the_limit():
    async def main() -> None:
        async with serving() as node:
            stream = await node.connect()
            await stream.send_all(b"POST / HTTP/1.1\r\nHost: x\r\n" + AUTH + b"Transfer-Encoding: chunked\r\n\r\n")
            await stream.send_all(b"%x\r\n%s\r\n" % (LIMIT // 2, b" " * (LIMIT // 2)))
            await stream.send_all(b"%x\r\n%s\r\n" % (LIMIT, b" " * LIMIT))
            reader = Reader(stream)
            status, headers, _ = await reader.answer()
            assert (status, headers["connection"], node.refused) == (413, "close", ["too_large"])
            assert await reader.closed()

    trio.run(main)


def test_malformed_requests_and_oversized_heads_are_refused_and_the_server_goes_on():
    async def main() -> None:
        async with serving() as node:
            for request, status, reason in [
                (b"POST / HTTP/1.1\r\nContent-Length: ten\r\n\r\n", 400, "malformed"),
                (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", 400, "malformed"),  # a TLS client hello
                (b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\nabc", 400, "malformed"),
                (b"GET /health HTTP/1.1\r\n" + b"X-Padding: " + b"p" * 70_000 + b"\r\n\r\n", 431, "head_too_large"),
            ]:
                stream = await node.connect()
                await stream.send_all(request)
                reader = Reader(stream)
                answer = await reader.answer()
                assert (answer[0], answer[1]["connection"], node.refused[-1]) == (status, "close", reason), request
                assert await reader.closed()
            assert (await exchange(node, _post(CALL)))[0] == 200

    trio.run(main)


def test_expect_100_continue_is_answered_before_the_body_is_sent():
    async def main() -> None:
        async with serving() as node:
            stream = await node.connect()
            head = b"POST / HTTP/1.1\r\nHost: x\r\n" + AUTH + b"Expect: 100-continue\r\n"
            await stream.send_all(head + b"Content-Length: %d\r\n\r\n" % len(CALL))
            reader = Reader(stream)
            assert (await reader.answer())[0] == 100
            await stream.send_all(CALL)
            assert json.loads((await reader.answer())[2])["result"] == 1

    trio.run(main)


def test_paths_and_methods():
    async def main() -> None:
        async with serving() as node:
            status, headers, _ = await exchange(node, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            assert (status, headers["allow"]) == (405, "POST")
            assert (await exchange(node, b"GET /nothing HTTP/1.1\r\nHost: x\r\n\r\n"))[0] == 404
            assert (await exchange(node, b"DELETE /health HTTP/1.1\r\nHost: x\r\n\r\n"))[0] == 405
            status, _, body = await exchange(node, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            assert (status, json.loads(body)) == (200, {"status": "ok"})
            stream = await node.connect()
            await stream.send_all(b"HEAD /health HTTP/1.1\r\nHost: x\r\n\r\n" + _post(CALL))
            reader = Reader(stream)
            status, headers, body = await reader.answer(head=True)
            assert status == 200 and int(headers["content-length"]) > 0 and body == b""
            assert json.loads((await reader.answer())[2])["result"] == 1  # nothing of a body came after the head
            assert (await exchange(node, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"))[0] == 401
            status, _, body = await exchange(node, b"GET /metrics HTTP/1.1\r\nHost: x\r\n" + AUTH + b"\r\n")
            assert status == 200 and b"expledger_http_rejected_total" in body

    trio.run(main)


def test_http_1_0_and_connection_close_end_the_connection_after_the_answer():
    async def main() -> None:
        async with serving() as node:
            for request in (
                b"GET /health HTTP/1.0\r\n\r\n",
                b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
            ):
                stream = await node.connect()
                await stream.send_all(request)
                reader = Reader(stream)
                status, headers, _ = await reader.answer()
                assert (status, headers["connection"]) == (200, "close") and await reader.closed()

    trio.run(main)


def test_an_http_1_0_client_asking_for_keep_alive_is_told_it_is_kept():
    async def main() -> None:
        async with serving() as node:
            stream = await node.connect()
            reader = Reader(stream)
            for _ in range(2):
                await stream.send_all(b"GET /health HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
                status, headers, _ = await reader.answer()
                assert (status, headers["connection"]) == (200, "keep-alive")

    trio.run(main)


def test_an_idle_connection_and_one_stalled_mid_request_are_closed_after_the_timeout():
    async def main() -> None:
        async with serving(idle_timeout=0.2) as node:
            idle = await node.connect()
            stalled = await node.connect()
            await stalled.send_all(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
            assert await Reader(idle).closed() and await Reader(stalled).closed()
            assert node.seen == []

    trio.run(main)


def test_a_request_trickled_a_byte_at_a_time_is_cut_off_at_the_timeout():
    async def main() -> None:
        async with serving(idle_timeout=0.3) as node:
            stream = await node.connect()
            request = b"GET /health HTTP/1.1\r\nX-Slow: " + b"s" * 150 + b"\r\n\r\n"
            sent = 0
            with contextlib.suppress(trio.BrokenResourceError):
                for byte in request:  # each byte well within the timeout, the whole request far beyond it
                    await stream.send_all(bytes([byte]))
                    sent += 1
                    await trio.sleep(0.02)
            assert sent < len(request), "the server waited for the whole trickled request"
            assert await Reader(stream).closed()

    trio.run(main)


HEALTH = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"


def test_a_full_server_evicts_the_oldest_connection_without_a_token_and_refuses_only_when_all_hold_one():
    async def main() -> None:
        async with serving(max_connections=2) as node:
            anonymous, holder = await node.connect(), await node.connect()
            await anonymous.send_all(HEALTH)  # no token: /health needs none
            await Reader(anonymous).answer()
            holder_reader = Reader(holder)
            await holder.send_all(_post(CALL))
            await holder_reader.answer()  # both have been accepted by now: accepting is in order
            newcomer = await node.connect()  # a third, with a token: the anonymous one makes room
            await newcomer.send_all(_post(CALL))
            status, _, body = await Reader(newcomer).answer()
            assert (status, json.loads(body)["result"], node.refused) == (200, 1, ["evicted"])
            assert await Reader(anonymous).closed()
            status, _, body = await exchange(node, HEALTH)  # the holder and the newcomer hold the two places
            assert (status, body, node.refused[-1]) == (503, b"too many connections\n", "too_many_connections")
            await holder.send_all(_post(CALL))
            assert (await holder_reader.answer())[0] == 200  # never evicted
            await holder.aclose()
            for _ in range(100):  # the server notices the close on its own schedule
                if (await exchange(node, HEALTH))[0] == 200:
                    break
                await trio.sleep(0.01)
            else:
                raise AssertionError("a closed connection's place was never freed")

    trio.run(main)


def test_a_request_head_has_its_own_deadline_and_a_keep_alive_wait_the_idle_timeout():
    async def main() -> None:
        async with serving(idle_timeout=30.0, header_timeout=0.3) as node:
            silent, partial, kept = await node.connect(), await node.connect(), await node.connect()
            await partial.send_all(b"POST / HTTP/1.1\r\nHost: x\r\n" + AUTH)  # a valid token, but no end of head
            kept_reader = Reader(kept)
            await kept.send_all(HEALTH)
            assert (await kept_reader.answer())[0] == 200
            assert await Reader(silent).closed() and await Reader(partial).closed()
            assert node.refused == ["header_timeout", "header_timeout"]
            await trio.sleep(0.6)  # twice the head's deadline: a connection between requests waits idle_timeout
            await kept.send_all(HEALTH)
            assert (await kept_reader.answer())[0] == 200

    trio.run(main)


async def _trickle(node: Node, head: bytes, closed_early: list[bool]) -> None:
    """Send `head` a byte at a time; record whether the server closed the connection before it was all sent."""
    stream = await node.connect()
    try:
        for byte in head:
            await stream.send_all(bytes([byte]))
            with trio.move_on_after(0.05):
                if not await stream.receive_some(65536):
                    closed_early.append(True)
                    return
    except (trio.BrokenResourceError, OSError):
        closed_early.append(True)
        return
    finally:
        await stream.aclose()
    closed_early.append(False)


def test_many_slow_connections_leave_room_for_token_holders_and_are_closed_at_the_header_deadline():
    """Slowloris: 100 connections trickling heads they never finish, on a server with room for 10. Every call with a
    token is answered meanwhile, and every slow connection is closed before its head is sent."""

    async def main() -> None:
        async with serving(max_connections=10, header_timeout=0.5) as node:
            slow_head = b"GET /health HTTP/1.1\r\nX-Slow: " + b"s" * 200  # 4 s at least, a byte per 20 ms
            closed_early: list[bool] = []
            answers: list[int] = []
            async with trio.open_nursery() as nursery:
                for _ in range(100):
                    nursery.start_soon(_trickle, node, slow_head, closed_early)
                    await trio.sleep(0)
                for index in range(20):
                    call = json.dumps({"jsonrpc": "2.0", "id": index, "method": "echo", "params": [index]})
                    status, _, body = await exchange(node, _post(call))
                    answers.append(json.loads(body)["result"] if status == 200 else status)
            assert answers == list(range(20))
            assert closed_early == [True] * 100
            # each slow connection ended one way or the other (which, depends on the order the server accepted them)
            assert len(node.refused) == 100 and set(node.refused) <= {"evicted", "header_timeout"}

    trio.run(main)


def test_a_request_with_two_authorization_or_host_headers_is_refused_400_whatever_their_order():
    async def main() -> None:
        async with serving() as node:
            wrong = b"Authorization: Bearer wrong\r\n"
            for extra in (wrong, AUTH.lower(), b"Host: y\r\n"):
                for request in (_post(CALL, extra), _post(CALL).replace(AUTH, extra + AUTH)):
                    stream = await node.connect()
                    await stream.send_all(request)
                    reader = Reader(stream)
                    status, headers, body = await reader.answer()
                    assert (status, headers["connection"]) == (400, "close"), request
                    assert body.startswith(b"the request repeats its ") and await reader.closed()
            assert node.seen == [] and set(node.refused) == {"repeated_header"}

    trio.run(main)


def test_a_drain_answers_the_call_in_flight_closes_idle_connections_and_stops_accepting():
    async def main() -> None:
        async with serving() as node:
            node.release = trio.Event()
            busy, idle = await node.connect(), await node.connect()
            await idle.send_all(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            idle_reader = Reader(idle)
            await idle_reader.answer()
            await busy.send_all(_post(CALL))
            await node.held.wait()
            node.drain.set()
            assert await idle_reader.closed()
            node.release.set()
            busy_reader = Reader(busy)
            status, headers, body = await busy_reader.answer()
            assert (status, headers["connection"], json.loads(body)["result"]) == (200, "close", 1)
            assert await busy_reader.closed()
            try:
                stream = await node.connect()
                assert await Reader(stream).closed()
            except OSError:
                pass  # refused: the listener is closed

    trio.run(main)


def test_a_stopping_node_answers_503_and_dispatches_nothing():
    async def main() -> None:
        async with serving() as node:
            node.state.stopping.set()
            status, _, body = await exchange(node, _post(CALL))
            assert (status, json.loads(body), node.seen) == (503, {"error": "the node is stopping"}, [])
            status, _, body = await exchange(node, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            assert (status, json.loads(body)) == (503, {"status": "stopping"})

    trio.run(main)


def test_a_failure_inside_dispatch_answers_500_and_the_connection_goes_on():
    async def main() -> None:
        async with serving() as node:
            stream = await node.connect()
            reader = Reader(stream)
            await stream.send_all(_post(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "broken"}).encode()))
            assert (await reader.answer())[:3:2] == (500, b"internal server error\n")
            await stream.send_all(_post(CALL))
            assert json.loads((await reader.answer())[2])["result"] == 1

    trio.run(main)


_PIECES = st.one_of(
    st.just(_post(CALL)),
    st.just(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"),
    st.just(b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"),
    st.binary(max_size=64).map(lambda body: _post(body)),
    st.binary(max_size=200),
    st.text(alphabet="GETPOS /HTP1.0:\r\nContent-Lgh-e", max_size=80).map(str.encode),
)


@settings(max_examples=200, deadline=None)
@given(pieces=st.lists(_PIECES, min_size=1, max_size=5), cuts=st.lists(st.integers(1, 50), max_size=6))
def test_any_bytes_get_well_formed_answers_or_a_close_and_the_server_goes_on(pieces, cuts):
    """Whatever arrives, split wherever: every answer is a whole HTTP/1.1 answer with a status the server uses, and
    a new connection is served afterwards."""
    data = b"".join(pieces)

    async def main() -> None:
        async with serving() as node:
            stream = await node.connect()
            start = 0
            for cut in cuts:
                await stream.send_all(data[start : start + cut])
                start += cut
            await stream.send_all(data[start:])
            await stream.send_eof()  # the server answers what it has, then closes
            reader = Reader(stream)
            with trio.fail_after(WAIT):
                while True:
                    try:
                        if not reader.buffer and not await reader._fill():
                            break
                        status, _, _ = await reader.answer()
                    except trio.BrokenResourceError:
                        break  # reset by the server after a refusal: allowed
                    assert status in (100, 200, 204, 400, 401, 404, 405, 413, 431, 503), status
            assert (await exchange(node, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"))[0] == 200

    trio.run(main)


def _handshake(path: str, key: bytes = b"dGhlIHNhbXBsZSBub25jZQ==", version: bytes = b"13") -> bytes:
    return (
        f"GET {path} HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n".encode()
        + b"Sec-WebSocket-Key: " + key + b"\r\nSec-WebSocket-Version: " + version + b"\r\n\r\n"
    )  # fmt: skip


def test_websocket_events_flow_pings_are_answered_and_the_hub_closing_ends_the_session_with_1001():
    async def main() -> None:
        async with serving() as node:
            stream = await node.connect()
            key = base64.b64encode(b"0123456789abcdef")
            client = WsConnection(ConnectionType.CLIENT)
            await stream.send_all(_handshake(f"/events?token={TOKEN}", key) + client.send(Ping(b"are you there")))
            reader = Reader(stream)
            status, headers, _ = await reader.answer(head=True)
            assert (status, headers["upgrade"]) == (101, "websocket")
            assert headers["sec-websocket-accept"] == base64.b64encode(hashlib.sha1(key + WS_GUID).digest()).decode()
            node.state.hub.publish("operation", {"n": 1})  # subscribed before the handshake was answered
            received: list[Any] = []
            client.receive_data(reader.buffer)
            while len(received) < 2:
                received += [event for event in client.events() if isinstance(event, (Pong, TextMessage))]
                if len(received) < 2:
                    client.receive_data(await stream.receive_some(65536))
            pongs = [event for event in received if isinstance(event, Pong)]  # in either order: two tasks answer
            texts = [json.loads(event.data) for event in received if isinstance(event, TextMessage)]
            assert pongs[0].payload == b"are you there" and texts[0]["data"] == {"n": 1}
            node.state.hub.close()
            while not (closing := [e for e in client.events() if isinstance(e, CloseConnection)]):
                client.receive_data(await stream.receive_some(65536))
            assert closing[0].code == 1001

    trio.run(main)


def test_websocket_handshakes_that_are_refused():
    async def main() -> None:
        async with serving() as node:
            assert (await exchange(node, _handshake("/events")))[0] == 403  # no token
            assert node.refused == [] and node.state.hub.listening is False
            assert (await exchange(node, _handshake(f"/events?token={TOKEN}", version=b"8")))[0] == 426
            assert (await exchange(node, _handshake(f"/elsewhere?token={TOKEN}")))[0] == 404

    trio.run(main)


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
