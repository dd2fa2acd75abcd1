"""The node's HTTP face: JSON-RPC at POST /, events at WS /events, /metrics and /health.

Every request but /health carries a token: the cookie the daemon writes at each start (Bitcoin
Core's scheme: `Authorization: Basic base64("__cookie__:<token>")`, or `Bearer <token>`), or one of
the static tokens of config.toml. A body over the limit is refused (413) as soon as its size is known.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import json
from collections.abc import Sequence
from dataclasses import dataclass, field

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


def presented_token(conn: HTTPConnection) -> str | None:
    """The token in `Authorization` (Bearer, or Basic with user __cookie__), or in `?token=` for websockets."""
    header = conn.headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() == "bearer":
        return value.strip()
    if scheme.lower() == "basic":
        try:
            user, _, password = base64.b64decode(value, validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return None
        return password if user == COOKIE_USER else None
    if conn.scope["type"] == "websocket":  # browsers cannot set headers on a websocket handshake
        return conn.query_params.get("token")
    return None


def is_authorized(conn: HTTPConnection, state: ServerState) -> bool:
    supplied = presented_token(conn)
    if not supplied:
        return False
    # compare with every token in constant time, so the answer's timing says nothing about which was close
    return any([hmac.compare_digest(supplied.encode(), token.encode()) for token in state.tokens])


def build_app(state: ServerState, max_body_bytes: int) -> Starlette:
    async def rpc(request: Request) -> Response:
        if state.stopping.is_set():
            return JSONResponse({"error": "the node is stopping"}, status_code=503)
        if not is_authorized(request, state):
            state.metrics.http_rejected.labels("unauthorized").inc()
            return Response(
                "a valid token is required: the cookie's (rpc.cookie in the node's home) or a configured one\n",
                status_code=401,
                headers={"WWW-Authenticate": 'Basic realm="expledger", Bearer realm="expledger"'},
            )
        body = await _read_capped(request, max_body_bytes)
        if body is None:
            state.metrics.http_rejected.labels("too_large").inc()
            # the rest of the body is never read, so the connection cannot carry another request: say so
            return Response(f"the body is larger than {max_body_bytes} bytes\n", 413, {"Connection": "close"})
        answer = await state.dispatcher.handle(body)
        if answer is None:
            return Response(status_code=204)
        return Response(answer, media_type="application/json")

    async def health(request: Request) -> Response:
        if state.stopping.is_set():
            return JSONResponse({"status": "stopping"}, status_code=503)
        return JSONResponse({"status": "ok", **state.health})

    async def metrics(request: Request) -> Response:
        if not is_authorized(request, state):
            state.metrics.http_rejected.labels("unauthorized").inc()
            return Response(status_code=401, headers={"WWW-Authenticate": 'Bearer realm="expledger"'})
        # negotiate like make_asgi_app: plain scrapers get text 0.0.4, Prometheus/OpenMetrics what they ask
        encode, content_type = choose_encoder(request.headers.get("accept", ""))
        return Response(encode(state.metrics.registry), headers={"Content-Type": content_type})

    async def events(ws: WebSocket) -> None:
        if not is_authorized(ws, state):
            state.metrics.http_rejected.labels("unauthorized").inc()
            await ws.close(code=WS_POLICY_VIOLATION)  # before accept: the client gets HTTP 403
            return
        try:
            with state.hub.subscribe() as subscription:
                await ws.accept()
                await _pump_events(ws, subscription, state.metrics)
        except HubClosed:
            await ws.close(code=WS_GOING_AWAY)

    return Starlette(
        routes=[
            Route("/", rpc, methods=["POST"]),
            Route("/health", health),
            Route("/metrics", metrics),
            WebSocketRoute("/events", events),
        ]
    )


async def _read_capped(request: Request, limit: int) -> bytes | None:
    """The body, or None as soon as it is known to exceed `limit` (from Content-Length before reading any of it)."""
    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > limit):
        return None
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


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
