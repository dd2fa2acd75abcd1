"""The node's HTTP face: JSON-RPC at POST /, events at WS /events, /metrics and /health.

Every request but /health carries a token: the cookie the daemon writes at each start (Bitcoin
Core's scheme: `Authorization: Basic base64("__cookie__:<token>")`, or `Bearer <token>`), or one of
the static tokens of config.toml. A body over the limit is refused (413) by the HTTP server
(node/httpserver.py) as soon as its size is known.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import trio
from prometheus_client.exposition import choose_encoder

from node.events import EventHub, HubClosed, Subscription
from node.httpserver import Request, Response, WebSocket, text_response
from node.jsonrpc import Dispatcher
from node.metrics import NodeMetrics

COOKIE_USER = "__cookie__"
WS_GOING_AWAY = 1001
WS_PING_INTERVAL = 20.0  # seconds; as the websockets client library pings


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


_JSON = b"application/json"
_STOPPING = Response(503, b'{"error":"the node is stopping"}', [(b"content-type", _JSON)])
_UNAUTHORIZED = text_response(
    401,
    "a valid token is required: the cookie's (rpc.cookie in the node's home) or a configured one\n",
    (b"www-authenticate", b'Basic realm="expledger", Bearer realm="expledger"'),
)
_NO_CONTENT = Response(204)
_NOT_FOUND = text_response(404, "not found: the node serves POST /, GET /health, GET /metrics and WS /events\n")


def _method_not_allowed(allowed: bytes) -> Response:
    return text_response(405, "method not allowed\n", (b"allow", allowed))


class NodeRoutes:
    """What each path answers; the HTTP server calls `handle` for requests and `websocket` for upgrades."""

    def __init__(self, state: ServerState) -> None:
        self._state = state

    def holds_token(self, authorization: bytes) -> bool:
        """Whether an Authorization header's value carries a valid token: the HTTP server keeps such a client's
        connection when it runs out of room (node/httpserver.py, "Slots")."""
        return is_authorized(presented_token(authorization.decode("latin-1")), self._state)

    def _authorized(self, request: Request, *, query_token: bool = False) -> bool:
        authorization = request.headers.get(b"authorization", b"").decode("latin-1")
        token = presented_token(authorization, request.query.get("token") if query_token else None)
        if is_authorized(token, self._state):
            return True
        self._state.metrics.http_rejected.labels("unauthorized").inc()
        return False

    async def handle(self, request: Request) -> Response:
        path, method = request.path, request.method
        if path == "/":
            return await self._rpc(request) if method == "POST" else _method_not_allowed(b"POST")
        if path in ("/health", "/metrics"):
            if method not in ("GET", "HEAD"):
                return _method_not_allowed(b"GET, HEAD")
            return self._health() if path == "/health" else self._metrics(request)
        return _NOT_FOUND

    async def _rpc(self, request: Request) -> Response:
        state = self._state
        if state.stopping.is_set():
            return _STOPPING
        if not self._authorized(request):
            return _UNAUTHORIZED
        answer = await state.dispatcher.handle(request.body)
        return _NO_CONTENT if answer is None else Response(200, answer, [(b"content-type", _JSON)])

    def _health(self) -> Response:
        if self._state.stopping.is_set():
            return _json(503, {"status": "stopping"})
        return _json(200, {"status": "ok", **self._state.health})

    def _metrics(self, request: Request) -> Response:
        if not self._authorized(request):
            return Response(401, headers=[(b"www-authenticate", b'Bearer realm="expledger"')])
        # negotiate like make_asgi_app: plain scrapers get text 0.0.4, Prometheus/OpenMetrics what they ask
        encode, content_type = choose_encoder(request.headers.get(b"accept", b"").decode("latin-1"))
        return Response(200, encode(self._state.metrics.registry), [(b"content-type", content_type.encode())])

    async def websocket(self, request: Request) -> Response | Callable[[WebSocket], Awaitable[None]]:
        """WS /events: each event as a JSON text message; refused (HTTP 403) without a token."""
        if request.path != "/events":
            return _NOT_FOUND
        if not self._authorized(request, query_token=True):
            return text_response(403, "a valid token is required (Authorization header or ?token=)\n")
        if self._state.stopping.is_set():
            return _STOPPING
        return self._events

    async def _events(self, ws: WebSocket) -> None:
        state = self._state
        try:
            with state.hub.subscribe() as subscription:  # before the handshake: no event after it is missed
                await ws.accept()
                await _pump_events(ws, subscription, state.metrics)
        except HubClosed:
            pass  # the node is stopping: the server refuses the handshake


def _json(status: int, value: Any) -> Response:
    return Response(status, json.dumps(value).encode(), [(b"content-type", _JSON)])


async def _pump_events(ws: WebSocket, subscription: Subscription, metrics: NodeMetrics) -> None:
    async with trio.open_nursery() as nursery:
        # a client that vanishes is only noticed by reading: the reader cancels the sender
        nursery.start_soon(_cancel_on_disconnect, ws, nursery.cancel_scope)
        nursery.start_soon(_ping_every, ws, WS_PING_INTERVAL)
        async for event in subscription.receive:
            if subscription.closing:
                break
            missed = subscription.take_missed()
            if missed:
                await ws.send_text(json.dumps({"type": "lagged", "missed": missed}))
            await ws.send_text(json.dumps(event))
            metrics.ws_events_sent.inc()
        await ws.close(WS_GOING_AWAY)  # the node is stopping
        nursery.cancel_scope.cancel()


async def _ping_every(ws: WebSocket, seconds: float) -> None:
    while True:
        await trio.sleep(seconds)
        await ws.ping()


async def _cancel_on_disconnect(ws: WebSocket, scope: trio.CancelScope) -> None:
    """Discard whatever the client sends; cancel the sender when it goes away."""
    while await ws.receive() is not None:
        pass
    scope.cancel()
