"""The node's HTTP face: JSON-RPC at POST /, events at WS /events, /metrics and /health.

Every request but /health carries a token: the cookie the daemon writes at each start (Bitcoin
Core's scheme: `Authorization: Basic base64("__cookie__:<token>")`, or `Bearer <token>`), or one of
the static tokens of config.toml. A body over the limit is refused (413) as soon as its size is known.

POST / is a bare ASGI endpoint that the app calls before Starlette: every submission pays the HTTP
layer's CPU under the GIL the ingest thread needs, and Starlette's middleware, routing and
Request/Response objects added about 0.03 ms to Hypercorn's 0.3 ms per request (measured with a
do-nothing handler). The other paths go through Starlette.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import json
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import trio
from prometheus_client.exposition import choose_encoder
from starlette.applications import Starlette
from starlette.requests import HTTPConnection, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket

from node.events import EventHub, HubClosed, Subscription
from node.jsonrpc import Dispatcher
from node.metrics import NodeMetrics

COOKIE_USER = "__cookie__"
WS_GOING_AWAY = 1001
WS_POLICY_VIOLATION = 1008


@dataclass
class ServerState:
    """What the HTTP layer needs from the node; built by the daemon, shared by every request."""

    tokens: Sequence[str]  # the cookie's token first, then the static ones
    dispatcher: Dispatcher
    hub: EventHub
    metrics: NodeMetrics
    health: dict[str, object] = field(default_factory=dict)
    stopping: trio.Event = field(default_factory=trio.Event)


def presented_token(authorization: str, query_token: str | None = None) -> str | None:
    """The token in an `Authorization` value (Bearer, or Basic with user __cookie__), else `query_token` (the
    `?token=` of a websocket: browsers cannot set headers on a websocket handshake)."""
    scheme, _, value = authorization.partition(" ")
    if scheme.lower() == "bearer":
        return value.strip()
    if scheme.lower() == "basic":
        try:
            user, _, password = base64.b64decode(value, validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return None
        return password if user == COOKIE_USER else None
    return query_token


def is_authorized(supplied: str | None, state: ServerState) -> bool:
    if not supplied:
        return False
    # compare with every token in constant time, so the answer's timing says nothing about which was close
    return any([hmac.compare_digest(supplied.encode(), token.encode()) for token in state.tokens])


def connection_token(conn: HTTPConnection) -> str | None:
    query_token = conn.query_params.get("token") if conn.scope["type"] == "websocket" else None
    return presented_token(conn.headers.get("authorization", ""), query_token)


Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

Answer = tuple[int, bytes, list[tuple[bytes, bytes]]]


def _answer(status: int, body: bytes, *first: tuple[bytes, bytes], media_type: bytes | None = None) -> Answer:
    """An answer built once, with its headers in the order Starlette's Response gave them."""
    headers = [*first, (b"content-length", str(len(body)).encode())]
    if media_type is not None:
        headers.append((b"content-type", media_type))
    return status, body, headers


_JSON = b"application/json"
_STOPPING = _answer(503, b'{"error":"the node is stopping"}', media_type=_JSON)
_UNAUTHORIZED = _answer(
    401,
    b"a valid token is required: the cookie's (rpc.cookie in the node's home) or a configured one\n",
    (b"www-authenticate", b'Basic realm="expledger", Bearer realm="expledger"'),
)
_NO_CONTENT: Answer = (204, b"", [])  # no Content-Length on a 204
_SERVER_ERROR = _answer(500, b"Internal Server Error", media_type=b"text/plain; charset=utf-8")


class RpcEndpoint:
    """JSON-RPC at POST /: token, body limit, dispatch, on the ASGI messages themselves."""

    def __init__(self, state: ServerState, max_body_bytes: int) -> None:
        self._state = state
        self._limit = max_body_bytes
        # the rest of the body is never read, so the connection cannot carry another request: say so
        self._too_large = _answer(
            413, f"the body is larger than {max_body_bytes} bytes\n".encode(), (b"connection", b"close")
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        state = self._state
        if state.stopping.is_set():
            await _respond(send, *_STOPPING)
            return
        authorization: bytes | None = None
        declared: bytes | None = None
        for name, value in scope["headers"]:  # ASGI servers give names in lower case; the first one counts
            if name == b"authorization" and authorization is None:
                authorization = value
            elif name == b"content-length" and declared is None:
                declared = value
        if not is_authorized(presented_token((authorization or b"").decode("latin-1")), state):
            state.metrics.http_rejected.labels("unauthorized").inc()
            await _respond(send, *_UNAUTHORIZED)
            return
        try:
            body = await self._read_capped(receive, declared)
        except _Disconnected:
            return  # nobody is left to answer
        if body is None:
            state.metrics.http_rejected.labels("too_large").inc()
            await _respond(send, *self._too_large)
            return
        try:
            answer = await state.dispatcher.handle(body)
        except Exception:
            await _respond(send, *_SERVER_ERROR)  # as Starlette did; the server logs the exception
            raise
        if answer is None:
            await _respond(send, *_NO_CONTENT)
        else:
            await _respond(
                send, 200, answer, [(b"content-length", str(len(answer)).encode()), (b"content-type", _JSON)]
            )

    async def _read_capped(self, receive: Receive, declared: bytes | None) -> bytes | None:
        """The body, or None as soon as it is known to exceed the limit (from Content-Length before reading any)."""
        if declared is not None and (not declared.isdigit() or int(declared) > self._limit):
            return None
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                raise _Disconnected
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self._limit:
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                return chunks[0] if len(chunks) == 1 else b"".join(chunks)


class _Disconnected(Exception):
    """The client went away before its request's body was read."""


async def _respond(send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def build_app(state: ServerState, max_body_bytes: int) -> ASGIApp:
    rpc = RpcEndpoint(state, max_body_bytes)

    async def health(request: Request) -> Response:
        if state.stopping.is_set():
            return JSONResponse({"status": "stopping"}, status_code=503)
        return JSONResponse({"status": "ok", **state.health})

    async def metrics(request: Request) -> Response:
        if not is_authorized(connection_token(request), state):
            state.metrics.http_rejected.labels("unauthorized").inc()
            return Response(status_code=401, headers={"WWW-Authenticate": 'Bearer realm="expledger"'})
        # negotiate like make_asgi_app: plain scrapers get text 0.0.4, Prometheus/OpenMetrics what they ask
        encode, content_type = choose_encoder(request.headers.get("accept", ""))
        return Response(encode(state.metrics.registry), headers={"Content-Type": content_type})

    async def events(ws: WebSocket) -> None:
        if not is_authorized(connection_token(ws), state):
            state.metrics.http_rejected.labels("unauthorized").inc()
            await ws.close(code=WS_POLICY_VIOLATION)  # before accept: the client gets HTTP 403
            return
        try:
            with state.hub.subscribe() as subscription:
                await ws.accept()
                await _pump_events(ws, subscription, state.metrics)
        except HubClosed:
            await ws.close(code=WS_GOING_AWAY)

    routed = Starlette(
        routes=[
            Route("/", rpc, methods=["POST"]),  # reached by other methods only: they get 405
            Route("/health", health),
            Route("/metrics", metrics),
            WebSocketRoute("/events", events),
        ]
    )

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == "/" and scope["method"] == "POST":
            await rpc(scope, receive, send)
        else:
            await routed(scope, receive, send)

    return app


async def _pump_events(ws: WebSocket, subscription: Subscription, metrics: NodeMetrics) -> None:
    async with trio.open_nursery() as nursery:
        # a client that vanishes is only noticed by reading: the reader cancels the sender
        nursery.start_soon(_cancel_on_disconnect, ws, nursery.cancel_scope)
        async for event in subscription.receive:
            if subscription.closing:
                break
            missed = subscription.take_missed()
            if missed:
                await ws.send_text(json.dumps({"type": "lagged", "missed": missed}))
            await ws.send_text(json.dumps(event))
            metrics.ws_events_sent.inc()
        await ws.close(code=WS_GOING_AWAY)  # the node is stopping
        nursery.cancel_scope.cancel()


async def _cancel_on_disconnect(ws: WebSocket, scope: trio.CancelScope) -> None:
    """Discard whatever the client sends; cancel the sender when it goes away."""
    while (await ws.receive())["type"] != "websocket.disconnect":
        pass
    scope.cancel()
