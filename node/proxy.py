"""An OpenAI-compatible endpoint that gives an agent's LLM calls the library: `[proxy] listen` in config.toml.

POST /v1/chat/completions is forwarded to the upstream server (`[proxy] upstream`, else `[llm] base_url`)
after the top-k experiences for the last user message are injected into that message with the retrieval
seed's template ("# Learned Experiences … --- # Problem <message>") within the token budget. The domain may
be narrowed by an `X-Expledger-Domain` header or by `metadata.expledger_domain` in the body. When nothing
scores above the threshold, the request's bytes are forwarded unchanged. The upstream's answer comes back
unchanged but for what says which experiences were injected: the header `X-Expledger-Injected` (ids,
comma-separated, empty for none) and, in a JSON answer, the field `expledger: {"injected": [...]}` (OpenAI
client libraries ignore unknown fields). With `stream: true` the server-sent events are passed on as they
arrive (the header only). GET /v1/models is forwarded as it is.

Auth is the RPC's: the cookie's token or a configured one, as the OpenAI `api_key` (Bearer). The upstream
gets the [llm] api_key (or EXPLEDGER_LLM_API_KEY), never the node's token. Failures answer with OpenAI-style
error objects: 401 `invalid_api_key`, 400 `invalid_request_error` naming the field, 502/504 naming the
upstream URL when it cannot be reached or does not answer in time.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx

from node.api import record_usage
from node.httpserver import Request, Response
from node.server import ServerState, is_authorized, presented_token
from node.service import Node
from node.usage import UsageStats

log = logging.getLogger("expledger.proxy")

DOMAIN_HEADER = b"x-expledger-domain"
INJECTED_HEADER = b"x-expledger-injected"
METADATA_DOMAIN = "expledger_domain"
MAX_QUERY_CHARS = 10_000  # the end of a longer message is what retrieval sees (the RPC's query limit)
MAX_DOMAIN_CHARS = 300
CONNECT_TIMEOUT = 10.0
_JSON = (b"content-type", b"application/json")


@dataclass(frozen=True, slots=True)
class Upstream:
    base_url: str  # ends in /v1 (or wherever the server's OpenAI routes live)
    api_key: str | None  # sent as Bearer; None: no Authorization header
    timeout: float  # seconds to wait for the upstream's answer (or its next streamed bytes)


class ProxyError(Exception):
    """A request the proxy answers itself, with an OpenAI-style error object."""

    def __init__(self, status: int, message: str, kind: str, code: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.kind, self.code, self.param = status, kind, code, param

    def response(self) -> Response:
        error = {"message": str(self), "type": self.kind, "param": self.param, "code": self.code}
        return Response(self.status, json.dumps({"error": error}).encode(), [_JSON])


def _bad_request(message: str, param: str | None = None) -> ProxyError:
    return ProxyError(400, message, "invalid_request_error", "invalid_request", param)


class ProxyRoutes:
    """The proxy's paths; `client` is an httpx.AsyncClient opened on the daemon's trio loop."""

    def __init__(
        self,
        state: ServerState,
        node: Node,
        usage: UsageStats | None,
        upstream: Upstream,
        client: httpx.AsyncClient,
        k: int,
        budget: int,
    ) -> None:
        self._state, self._node, self._usage = state, node, usage
        self._upstream, self._client = upstream, client
        self._k, self._budget = k, budget

    async def handle(self, request: Request) -> Response:
        try:
            if not self._authorized(request):
                raise ProxyError(
                    401,
                    "a valid api_key is required: the node's token (rpc.cookie in its home) or one of [rpc] tokens",
                    "invalid_request_error",
                    "invalid_api_key",
                )
            path = request.path.rstrip("/")
            if path.endswith("/chat/completions"):
                return await self._chat(request) if request.method == "POST" else _not_allowed("POST")
            if path.endswith("/models"):
                return await self._models() if request.method == "GET" else _not_allowed("GET")
            raise ProxyError(
                404,
                f"{request.path}: the proxy serves POST /v1/chat/completions and GET /v1/models",
                "not_found",
                "404",
            )
        except ProxyError as exc:
            return exc.response()

    async def websocket(self, request: Request) -> Response:
        """No websocket here (the node's events are on the RPC server)."""
        return ProxyError(404, "the proxy serves no websocket", "not_found", "404").response()

    def _authorized(self, request: Request) -> bool:
        authorization = request.headers.get(b"authorization", b"").decode("latin-1")
        return is_authorized(presented_token(authorization), self._state)

    async def _models(self) -> Response:
        answer = await self._forward(self._client.build_request("GET", self._url("/models"), headers=self._headers()))
        return _passed_on(answer, await self._read(answer), None)

    async def _chat(self, request: Request) -> Response:
        body = _json_body(request.body)
        injected = await self._inject(body, _domain(request, body))
        forwarded = json.dumps(body, ensure_ascii=False).encode() if injected else request.body
        header = ",".join(injected).encode()
        upstream = self._client.build_request(
            "POST", self._url("/chat/completions"), content=forwarded, headers=self._headers(json_body=True)
        )
        answer = await self._forward(upstream)
        if body.get("stream") is True and answer.status_code == 200:
            return Response(
                200,
                headers=[
                    (b"content-type", answer.headers.get("content-type", "text/event-stream").encode()),
                    (b"cache-control", b"no-cache"),
                    (INJECTED_HEADER, header),
                ],
                stream=self._events(answer),
            )
        data = await self._read(answer)
        if answer.status_code == 200:
            data = _with_injected(data, injected)
        return _passed_on(answer, data, header)

    async def _inject(self, body: dict[str, Any], domain: str | None) -> list[str]:
        """Put the library's experiences into the last user message; the ids injected (none: `body` is as it
        was). Each is counted as served by the proxy, on disk before the request goes on."""
        message = _last_user_message(body["messages"])
        query = _text_of(message.get("content"))[-MAX_QUERY_CHARS:] if message else ""
        if message is None or not query.strip():
            return []
        retriever = self._node.retriever
        prompt, hits = await self._node.read(retriever.injection, query, self._k, None, self._budget, domain)
        if not hits:
            return []
        _prepend(message, prompt[: -len(query)])
        if self._usage is not None:
            await record_usage(self._node, self._usage, hits, "proxy", domain)
        return [str(hit.id) for hit in hits]

    async def _events(self, answer: httpx.Response) -> AsyncIterator[bytes]:
        """The upstream's event stream as it arrives; if the upstream fails part way, a last event carries an
        OpenAI-style error (the openai package raises it), and the stream ends."""
        try:
            async for chunk in answer.aiter_raw():
                yield chunk
        except httpx.HTTPError as exc:
            log.warning("the upstream's stream broke: %s", exc)
            error = self._unreachable(exc)
            yield b"data: " + json.dumps({"error": {"message": str(error), "type": error.kind}}).encode() + b"\n\n"
        finally:
            await answer.aclose()

    async def _forward(self, request: httpx.Request) -> httpx.Response:
        try:
            return await self._client.send(request, stream=True)
        except httpx.HTTPError as exc:
            raise self._unreachable(exc) from None

    async def _read(self, answer: httpx.Response) -> bytes:
        try:
            return await answer.aread()
        except httpx.HTTPError as exc:
            raise self._unreachable(exc) from None
        finally:
            await answer.aclose()

    def _unreachable(self, exc: httpx.HTTPError) -> ProxyError:
        where = self._upstream.base_url
        if isinstance(exc, httpx.TimeoutException):
            message = f"the upstream {where} did not answer within {self._upstream.timeout:.0f} s"
            return ProxyError(504, message, "upstream_error", "upstream_timeout")
        message = f"the upstream {where} cannot be reached ({type(exc).__name__}: {exc or 'no detail'})"
        return ProxyError(502, message, "upstream_error", "upstream_unreachable")

    def _url(self, path: str) -> str:
        return self._upstream.base_url.rstrip("/") + path

    def _headers(self, json_body: bool = False) -> dict[str, str]:
        headers = {"accept": "application/json, text/event-stream"}
        if json_body:
            headers["content-type"] = "application/json"
        if self._upstream.api_key:
            headers["authorization"] = f"Bearer {self._upstream.api_key}"
        return headers


def _not_allowed(allowed: str) -> Response:
    response = ProxyError(405, f"method not allowed: use {allowed}", "invalid_request_error", "method_not_allowed")
    answer = response.response()
    answer.headers.append((b"allow", allowed.encode()))
    return answer


def _json_body(data: bytes) -> dict[str, Any]:
    try:
        body = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _bad_request(f"the body is not JSON ({exc})") from None
    if not isinstance(body, dict):
        raise _bad_request("the body must be a JSON object")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
        raise _bad_request("messages: expected a non-empty array of message objects", "messages")
    return body


def _domain(request: Request, body: dict[str, Any]) -> str | None:
    """The domain asked for, by header (first) or metadata; None for any."""
    header = request.headers.get(DOMAIN_HEADER)
    if header is not None:
        domain: Any = header.decode("utf-8", "replace")
        param = "X-Expledger-Domain"
    else:
        metadata = body.get("metadata")
        domain = metadata.get(METADATA_DOMAIN) if isinstance(metadata, dict) else None
        param = f"metadata.{METADATA_DOMAIN}"
    if domain is None:
        return None
    if not isinstance(domain, str) or not 0 < len(domain.strip()) <= MAX_DOMAIN_CHARS:
        raise _bad_request(f"{param}: expected a domain such as math.geometry", param)
    return domain.strip()


def _last_user_message(messages: list[dict[str, Any]]) -> dict[str, Any] | None:
    return next((message for message in reversed(messages) if message.get("role") == "user"), None)


def _text_of(content: Any) -> str:
    """A message's text: the string, or its text parts joined (images and audio are not text)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [part.get("text") for part in content if isinstance(part, dict) and part.get("type") == "text"]
        return "\n".join(part for part in parts if isinstance(part, str))
    return ""


def _prepend(message: dict[str, Any], prefix: str) -> None:
    """Put the template's part before the problem ahead of the message: its text, or a first text part."""
    content = message["content"]
    if isinstance(content, str):
        message["content"] = prefix + content
    else:
        message["content"] = [{"type": "text", "text": prefix}, *content]


def _with_injected(data: bytes, injected: list[str]) -> bytes:
    """The upstream's JSON answer with the ids injected; anything but a JSON object is passed on as it is."""
    try:
        answer = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return data
    if not isinstance(answer, dict):
        return data
    answer["expledger"] = {"injected": injected}
    return json.dumps(answer, ensure_ascii=False).encode()


def _passed_on(answer: httpx.Response, data: bytes, injected: bytes | None) -> Response:
    headers = [(b"content-type", answer.headers.get("content-type", "application/json").encode())]
    if injected is not None:
        headers.append((INJECTED_HEADER, injected))
    return Response(answer.status_code, data, headers)
