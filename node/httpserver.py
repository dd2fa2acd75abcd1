"""A small HTTP/1.1 server on trio: keep-alive connections parsed by httptools (Node.js's llhttp), websocket
upgrades framed by wsproto.

Why not a framework: every request's CPU is spent under the GIL the ingest thread needs. With the same
JSON-RPC dispatcher and 8 keep-alive clients on a 2-core machine, Hypercorn's trio worker (with a bare ASGI
endpoint) spent 0.93 ms of CPU per call, an h11 loop of our own 0.26 ms, this server 0.13 ms; README "The daemon
over RPC" has what it did to `submit`. The node needs little of HTTP: a few paths, bodies up to a limit,
keep-alive, one websocket, a graceful stop.

What it does: requests on a connection are answered in order (pipelining included); a body is read whole up to
`max_body` (a larger Content-Length is refused before reading, a chunked body as soon as it passes the limit:
413 and the connection closes); `Expect: 100-continue` is honoured; malformed HTTP gets 400 and the connection
closes, and so does a request that repeats a header that must appear once (`Authorization`, `Host`: which of
two tokens counts must not be left to chance). At `drain` the listener stops accepting, idle connections close,
requests in flight are answered, and whatever is still open after `graceful_timeout` is cancelled.

Deadlines: a request's head (request line and headers) must arrive whole within `header_timeout` of its first
bytes, or of the accept for a connection's first request (nginx's client_header_timeout, Go's ReadHeaderTimeout,
which geth sets); the whole request within `idle_timeout` of its first bytes; a keep-alive connection may wait
`idle_timeout` between requests. A client trickling a byte at a time holds a connection for `header_timeout`.

Slots: at most `max_connections` connections are open. A connection proves itself by presenting a valid token
(`holds_token` judges an Authorization header as soon as it arrives, or a websocket session is authorised);
until then it is unproven. When every slot is taken, a new connection evicts the oldest unproven one (closed
without an answer); only when all are proven is it answered 503. Why this and not the alternatives: every RPC
client is on 127.0.0.1, attackers too, so a per-IP cap (nginx's limit_conn, Bitcoin Core's per-netgroup
inbound eviction) cannot tell them apart; a reserve of slots for token holders does not help either, because a
connection's token is only known once its head arrives, so the reserve fills with heads that never complete.
Evicting oldest-first is nginx's reuse of idle connections when worker_connections run out, extended to
connections that have not shown a token: a legitimate client sends its head within milliseconds of connecting,
and would be evicted only if `max_connections` newer connections arrived before that; an attacker reopening
connections as they close only evicts its own. geth (Go's net/http) and Bitcoin Core (libevent, 30 s
rpcservertimeout) cap neither connections nor their order, and rely on timeouts and the file-descriptor limit.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from email.utils import formatdate
from http import HTTPStatus
from typing import Any
from urllib.parse import parse_qsl

import httptools
import trio
from wsproto.connection import Connection as WsConnection
from wsproto.connection import ConnectionState, ConnectionType
from wsproto.events import BytesMessage, CloseConnection, Ping, TextMessage
from wsproto.utilities import LocalProtocolError

log = logging.getLogger(__name__)

RECEIVE_BYTES = 65536
MAX_HEAD_BYTES = 65536  # request line and headers; more is refused (431)
MAX_CONNECTIONS = 1024  # open at once, by default (see "Slots" above)
HEADER_TIMEOUT = 5.0  # seconds a request's head may take to arrive whole, by default
#: request headers that must appear once (RFC 9110 §5.3: only list-valued fields may repeat; RFC 9112 §3.2: two
#: Host lines are a 400)
SINGLE_HEADERS = frozenset({b"authorization", b"host"})
#: after refusing a request unread, the rest of what the client sends is read and dropped for up to this long:
#: closing with unread data would reset the connection, and the client could lose the answer (nginx's lingering close)
LINGER_SECONDS = 2.0
LINGER_BYTES = 16 << 20
WS_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"  # RFC 6455 §1.3


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[bytes, bytes]  # names in lower case; the first of a repeated header counts (but see SINGLE_HEADERS)
    body: bytes = b""
    version: str = "1.1"


@dataclass
class Response:
    status: int
    body: bytes = b""
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)  # besides length, date and connection
    close: bool = False  # close the connection after this answer
    #: a body sent as it is produced (chunked), instead of `body`: the proxy's server-sent events. If it fails
    #: part way, the connection closes (the client sees a cut answer, never a wrong one)
    stream: AsyncIterator[bytes] | None = None


def text_response(status: int, text: str, *headers: tuple[bytes, bytes]) -> Response:
    return Response(status, text.encode(), [(b"content-type", b"text/plain; charset=utf-8"), *headers])


class WebSocket:
    """A server-side websocket after the handshake: text out, anything in; pings are answered as they arrive."""

    def __init__(self, stream: trio.SocketStream, key: bytes, trailing: bytes) -> None:
        self._stream = stream
        self._key = key
        self._ws = WsConnection(ConnectionType.SERVER, trailing_data=trailing)
        self._send_lock = trio.Lock()
        self.accepted = False

    async def accept(self) -> None:
        """Complete the handshake (RFC 6455 §4.2.2): the session may first subscribe to what it will send."""
        accept = base64.b64encode(hashlib.sha1(self._key + WS_GUID).digest())
        await self._stream.send_all(
            b"HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: Upgrade\r\n"
            b"sec-websocket-accept: " + accept + b"\r\n\r\n"
        )
        self.accepted = True

    async def send_text(self, text: str) -> None:
        await self._send(TextMessage(data=text))

    async def receive(self) -> str | bytes | None:
        """The next message, or None once the client closed or went away."""
        while True:
            for event in self._ws.events():
                if isinstance(event, (TextMessage, BytesMessage)):
                    return event.data
                if isinstance(event, Ping):
                    await self._send(event.response())
                elif isinstance(event, CloseConnection):
                    if self._ws.state is ConnectionState.REMOTE_CLOSING:
                        await self._send(event.response())
                    return None
            try:
                data = await self._stream.receive_some(RECEIVE_BYTES)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return None
            if not data:
                return None
            self._ws.receive_data(data)

    async def ping(self) -> None:
        """A ping: with the socket's TCP_USER_TIMEOUT it finds a client that vanished without closing."""
        await self._send(Ping())

    async def close(self, code: int) -> None:
        if self._ws.state is ConnectionState.OPEN:
            await self._send(CloseConnection(code=code))

    async def _send(self, event: Any) -> None:
        async with self._send_lock:
            # a client that is gone is seen by its reader
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError, LocalProtocolError):
                await self._stream.send_all(self._ws.send(event))


Handler = Callable[[Request], Awaitable[Response]]
#: decides on a websocket handshake: a Response refuses it; a session calls `accept` and runs until it returns
WebSocketHandler = Callable[[Request], Awaitable["Response | Callable[[WebSocket], Awaitable[None]]"]]


class _Parsing:
    """httptools callbacks: requests completed by the bytes fed so far, and the one in progress."""

    def __init__(self, max_body: int, holds_token: Callable[[bytes], bool]) -> None:
        self.max_body = max_body
        self.holds_token = holds_token
        self.done: list[tuple[Request, bool]] = []  # each with whether the connection may stay open after it
        #: why the request under way is refused ("too_large", "head_too_large", "repeated_header"): the first reason
        #: stands, and neither it nor anything after it on this connection is answered
        self.refusal: str | None = None
        self.repeated = b""  # the header of SINGLE_HEADERS that came twice
        self.vouched = False  # a request on this connection carried a valid token
        self.expects_continue = False
        #: bytes received while a request's head was incomplete (at most one read more than that head: the limit
        #: bounds what httptools buffers of a header still arriving)
        self.head_bytes = 0
        self.in_request = False
        self.parser = httptools.HttpRequestParser(self)
        self._begin()

    def _begin(self) -> None:
        self._url = b""
        self._headers: dict[bytes, bytes] = {}
        self._body: list[bytes] = []
        self._size = 0
        self._head_size = 0
        self.headers_complete = False
        self.head_bytes = 0

    def on_message_begin(self) -> None:
        self.in_request = True

    def on_url(self, url: bytes) -> None:
        self._url += url
        self._head_size += len(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        self._head_size += len(name) + len(value) + 4
        if name in self._headers:
            if name in SINGLE_HEADERS and self.refusal is None:
                self.refusal, self.repeated = "repeated_header", name
            return
        self._headers[name] = value
        if name == b"authorization" and not self.vouched:
            self.vouched = self.holds_token(value)

    def on_headers_complete(self) -> None:
        self.headers_complete = True
        self.head_bytes = 0
        if self.refusal is not None:
            return
        declared = self._headers.get(b"content-length")
        if self._head_size > MAX_HEAD_BYTES:
            self.refusal = "head_too_large"
        elif declared is not None and int(declared) > self.max_body:  # llhttp has checked it is a number
            self.refusal = "too_large"
        elif self._headers.get(b"expect", b"").lower() == b"100-continue":
            self.expects_continue = True

    def on_body(self, body: bytes) -> None:
        if self.refusal is not None:
            return
        self._size += len(body)
        if self._size > self.max_body:
            self.refusal = "too_large"
        else:
            self._body.append(body)

    def on_message_complete(self) -> None:
        if self.refusal is not None:
            return
        path, _, query = self._url.decode("latin-1").partition("?")
        request = Request(
            self.parser.get_method().decode("latin-1"),
            path,
            dict(parse_qsl(query)),
            self._headers,
            b"".join(self._body),
            self.parser.get_http_version(),
        )
        self.done.append((request, self.parser.should_keep_alive()))
        self.in_request = False
        self.expects_continue = False
        self._begin()


@dataclass(eq=False)
class _Slot:
    """One open connection's place: its scope (cancelled to evict it) and whether it still counts as open."""

    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    counted: bool = True


class HttpServer:
    """Serves `handle` (and `websocket` for upgrade requests) on a listening socket until drained."""

    def __init__(
        self,
        handle: Handler,
        websocket: WebSocketHandler,
        *,
        max_body: int,
        idle_timeout: float,
        graceful_timeout: float,
        header_timeout: float = HEADER_TIMEOUT,
        max_connections: int = MAX_CONNECTIONS,
        holds_token: Callable[[bytes], bool] = lambda authorization: False,
        refused: Callable[[str], None] = lambda reason: None,
    ) -> None:
        """`holds_token` says whether an Authorization header's value carries a valid token (such a connection is
        never evicted); `refused` is told the reason of each connection or request refused before it was handled
        (for metrics)."""
        self._max_connections = max_connections
        self._holds_token = holds_token
        self._refused = refused
        self._handle = handle
        self._websocket = websocket
        self._max_body = max_body
        self._idle_timeout = idle_timeout
        self._header_timeout = header_timeout
        self._graceful_timeout = graceful_timeout
        self._connections = 0
        self._unproven: dict[_Slot, None] = {}  # connections that have shown no token, oldest first
        self._draining = False
        self._idle: set[trio.CancelScope] = set()  # the reads of connections between requests
        self._date = (0, b"")

    async def serve(
        self, listener: trio.SocketListener, drain: trio.Event, *, task_status: trio.TaskStatus[None]
    ) -> None:
        """Accept until `drain` is set; return once every connection has closed or the grace period is over."""
        async with trio.open_nursery() as connections:
            async with trio.open_nursery() as accepting:
                accepting.start_soon(self._accept, listener, connections)
                task_status.started()
                await drain.wait()
                accepting.cancel_scope.cancel()
            await listener.aclose()
            self._draining = True
            for scope in list(self._idle):
                scope.cancel()
            connections.cancel_scope.deadline = trio.current_time() + self._graceful_timeout

    async def _accept(self, listener: trio.SocketListener, connections: trio.Nursery) -> None:
        while True:
            try:
                stream = await listener.accept()
            except OSError as exc:  # out of descriptors, say: wait a little rather than spin
                log.warning("accepting an RPC connection failed: %s", exc)
                await trio.sleep(0.1)
                continue
            connections.start_soon(self._connection, stream)

    async def _connection(self, stream: trio.SocketStream) -> None:
        slot = _Slot()
        self._connections += 1
        try:
            if self._connections > self._max_connections and not self._evict_oldest_unproven():
                self._refused("too_many_connections")
                await self._send(stream, text_response(503, "too many connections\n"), keep_alive=False)
                return
            self._unproven[slot] = None
            with slot.scope:
                await self._requests(stream, slot)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the client went away
        except Exception:  # one connection's failure must not end the server
            log.exception("an RPC connection failed")
        finally:
            self._unproven.pop(slot, None)
            if slot.counted:
                self._connections -= 1
            with trio.CancelScope(shield=True), trio.move_on_after(1):
                await stream.aclose()

    def _evict_oldest_unproven(self) -> bool:
        """Close the oldest connection that has shown no token, to make room; False if every one has."""
        if not self._unproven:
            return False
        oldest = next(iter(self._unproven))
        del self._unproven[oldest]
        oldest.counted = False  # its place is free now, though its task closes the socket a moment later
        self._connections -= 1
        oldest.scope.cancel()
        self._refused("evicted")
        return True

    def _prove(self, slot: _Slot) -> None:
        """The connection carried a valid token: it keeps its place."""
        self._unproven.pop(slot, None)

    async def _requests(self, stream: trio.SocketStream, slot: _Slot) -> None:
        parsing = _Parsing(self._max_body, self._holds_token)
        #: when the request under way began: the first one's clock starts at the accept, a later one's at its first
        #: bytes (None: waiting for them, after an answer)
        started: float | None = trio.current_time()
        while True:
            data = await self._receive(stream, self._deadline(started, parsing), idle=not parsing.in_request)
            if data is None:  # the deadline passed: a keep-alive wait ends quietly, a request under way is counted
                if started is not None:
                    self._refused("request_timeout" if parsing.headers_complete else "header_timeout")
                return
            if not data:
                return  # closed by the client, or the server is draining
            if started is None:
                started = trio.current_time()
            if not parsing.headers_complete:
                parsing.head_bytes += len(data)
            upgrade_at: int | None = None
            malformed: str | None = None
            try:
                parsing.parser.feed_data(data)
            except httptools.HttpParserUpgrade as upgrade:
                upgrade_at = upgrade.args[0]
            except httptools.HttpParserError as exc:
                malformed = str(exc)  # llhttp's reason, such as "Invalid header token": no byte of the request
            if parsing.vouched:
                self._prove(slot)
            if parsing.refusal is None and not parsing.headers_complete and parsing.head_bytes > MAX_HEAD_BYTES:
                parsing.refusal = "head_too_large"
            refusal = self._refusal(parsing, malformed)
            # the requests complete before a refused one are answered first: answers go out in order
            while parsing.done:
                request, keep_alive = parsing.done.pop(0)
                if upgrade_at is not None and not parsing.done:
                    await self._upgrade(stream, request, data[upgrade_at:], slot)
                    return
                response = await self._answer(request)
                keep_alive = keep_alive and not response.close and not self._draining
                await self._send(stream, response, keep_alive=keep_alive, request=request)
                if not keep_alive:
                    return
                # a request begun behind this one (pipelined) gets its whole time from now
                started = trio.current_time() if parsing.in_request else None
            if refusal is not None:
                await self._refuse(stream, *refusal)
                return
            if parsing.expects_continue:
                parsing.expects_continue = False
                await stream.send_all(b"HTTP/1.1 100 Continue\r\n\r\n")

    def _refusal(self, parsing: _Parsing, malformed: str | None) -> tuple[str, Response] | None:
        """The reason and the answer for a request refused unread, if one is (the first reason in the stream)."""
        match parsing.refusal:
            case "too_large":
                return "too_large", text_response(413, f"the body is larger than {self._max_body} bytes\n")
            case "head_too_large":
                return "head_too_large", text_response(431, "the request's headers are too large\n")
            case "repeated_header":
                name = parsing.repeated.decode("latin-1").title()
                return "repeated_header", text_response(400, f"the request repeats its {name} header\n")
        if malformed is not None:
            return "malformed", text_response(400, f"malformed HTTP request: {malformed}\n")
        return None

    async def _refuse(self, stream: trio.SocketStream, reason: str, response: Response) -> None:
        """Answer and close a connection whose request was not read to its end."""
        self._refused(reason)
        await self._send(stream, response, keep_alive=False)
        await stream.send_eof()
        dropped = 0
        with trio.move_on_after(LINGER_SECONDS):
            while dropped < LINGER_BYTES and (data := await stream.receive_some(RECEIVE_BYTES)):
                dropped += len(data)

    def _deadline(self, started: float | None, parsing: _Parsing) -> float:
        """When the request under way must have arrived (its head sooner than the rest); between requests, the end
        of the keep-alive wait, which starts now."""
        if started is None:
            return trio.current_time() + self._idle_timeout
        if parsing.headers_complete:
            return started + self._idle_timeout
        return started + min(self._header_timeout, self._idle_timeout)

    async def _receive(self, stream: trio.SocketStream, deadline: float, *, idle: bool) -> bytes | None:
        """The next bytes; b"" at the end of the stream or when draining finds the connection `idle` (no byte of a
        next request yet), None at the deadline."""
        if idle and self._draining:
            return b""
        with trio.move_on_at(deadline) as scope:
            if idle:
                self._idle.add(scope)
            try:
                return await stream.receive_some(RECEIVE_BYTES)
            finally:
                self._idle.discard(scope)
        return b"" if self._draining else None

    async def _answer(self, request: Request) -> Response:
        try:
            return await self._handle(request)
        except Exception:
            log.exception("answering %s %s failed", request.method, request.path)
            return text_response(500, "internal server error\n")

    async def _upgrade(self, stream: trio.SocketStream, request: Request, trailing: bytes, slot: _Slot) -> None:
        """A websocket handshake (RFC 6455 §4.2), then the session the websocket handler returns."""
        key = request.headers.get(b"sec-websocket-key")
        is_websocket = request.headers.get(b"upgrade", b"").lower() == b"websocket"
        if request.method != "GET" or not is_websocket or key is None:
            await self._send(stream, text_response(400, "only websocket upgrades are served\n"), keep_alive=False)
            return
        if request.headers.get(b"sec-websocket-version") != b"13":
            refusal = text_response(426, "websocket version 13 is required\n", (b"sec-websocket-version", b"13"))
            await self._send(stream, refusal, keep_alive=False)
            return
        try:
            decision = await self._websocket(request)
        except Exception:
            log.exception("deciding on a websocket at %s failed", request.path)
            decision = text_response(500, "internal server error\n")
        if isinstance(decision, Response):
            await self._send(stream, decision, keep_alive=False)
            return
        self._prove(slot)  # the handler authorised the session (with a ?token= that no header carried, say)
        ws = WebSocket(stream, key, trailing)
        await decision(ws)
        if not ws.accepted:  # the session found it could not serve (the node began to stop meanwhile)
            await self._send(stream, text_response(503, "unavailable\n"), keep_alive=False)

    async def _send(
        self, stream: trio.SocketStream, response: Response, *, keep_alive: bool, request: Request | None = None
    ) -> None:
        """The whole answer in one write: status line, headers and body (none to HEAD)."""
        reason = HTTPStatus(response.status).phrase.encode()
        lines = [b"HTTP/1.1 %d %s" % (response.status, reason), b"date: " + self._now()]
        lines += [name + b": " + value for name, value in response.headers]
        if response.status != 204:
            lines.append(b"content-length: %d" % len(response.body))
        if not keep_alive:
            lines.append(b"connection: close")
        elif request is not None and request.version == "1.0":  # an HTTP/1.0 client asked to keep it open
            lines.append(b"connection: keep-alive")
        head = request is not None and request.method == "HEAD"
        if response.stream is not None:
            await self._send_stream(stream, lines, response.stream)
            return
        await stream.send_all(b"\r\n".join(lines) + b"\r\n\r\n" + (b"" if head else response.body))

    async def _send_stream(self, stream: trio.SocketStream, lines: list[bytes], chunks: AsyncIterator[bytes]) -> None:
        """The head, then each chunk as it comes (RFC 9112 §7.1 chunked coding)."""
        lines = [line for line in lines if not line.startswith(b"content-length: ")]
        lines.append(b"transfer-encoding: chunked")
        await stream.send_all(b"\r\n".join(lines) + b"\r\n\r\n")
        async with contextlib.aclosing(chunks):  # type: ignore[type-var]
            async for chunk in chunks:
                if chunk:
                    await stream.send_all(b"%x\r\n%b\r\n" % (len(chunk), chunk))
        await stream.send_all(b"0\r\n\r\n")

    def _now(self) -> bytes:
        """The Date header's value, formatted once a second."""
        second = int(time.time())
        if self._date[0] != second:
            self._date = (second, formatdate(second, usegmt=True).encode())
        return self._date[1]
