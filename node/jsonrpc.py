"""JSON-RPC 2.0 dispatch, independent of the HTTP server so it can be tested on bytes alone.

Existing libraries do not fit: jsonrpcserver's async_dispatch calls asyncio.gather (fails under trio) and
json-rpc/tinyrpc are synchronous. The spec is small enough to implement exactly.

Errors: the five standard codes, and the node's own range (-32000 to -32099) whose `data` always
carries a stable dotted `code` (the ledger's, e.g. `text.structure`) and often the `field`. A message names the
condition; it repeats at most ECHO_CHARS characters of what the client sent (`clip`), and no message is longer
than MAX_MESSAGE_CHARS; what only the operator needs (a traceback, a path) goes to the log.
"""

from __future__ import annotations

import inspect
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import trio

from ledger.errors import LedgerError

log = logging.getLogger(__name__)

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
#: the node's own codes; `data.code` says precisely what went wrong
LEDGER_ERROR = -32000  # input the ledger refused (an experience that breaks a rule, a bad CID, ...)
REJECTED = -32001  # a submitted operation was rejected: `data.errors` lists every broken rule
NOT_FOUND = -32002  # no such experience, operation or log position here
BUSY = -32003  # the ingest queue is full: retry later
STOPPING = -32004  # the node is shutting down
UNAVAILABLE = -32005  # a peer could not be reached (peers.connect)
ECHO_CHARS = 100  # characters of a client's input an error message repeats, at most
MAX_MESSAGE_CHARS = 300  # an error message's length, at most, whatever it quotes
UNWRITABLE = -32006  # the store takes no writes (free space under the reserve, or after a failed write); reads go on

Handler = Callable[..., Awaitable[Any]]
#: what a client hears of a bug in a method; the traceback is in the node's log
INTERNAL_MESSAGE = "internal error: the method failed unexpectedly; the node's log has the details"


class RpcError(Exception):
    """Raised by a handler to return a JSON-RPC error object instead of a result."""

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data


def clip(text: str, limit: int = ECHO_CHARS) -> str:
    """A client's string as an error message repeats it: whole when short, else its first `limit` characters and
    its length (a 100 KB method name must not come back whole)."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text)} characters)"


def invalid_params(field: str, message: str, code: str = "params.type") -> RpcError:
    """The error for one bad parameter, naming it."""
    return RpcError(INVALID_PARAMS, f"{field}: {message}", {"code": code, "field": field})


class CallObserver(Protocol):
    """Receives one observation per call so metrics stay out of the dispatcher."""

    def observe_call(self, method: str, outcome: str, seconds: float) -> None: ...


def _error(request_id: Any, code: int, message: str, data: Any = None) -> dict[str, Any]:
    error: dict[str, Any] = {"code": code, "message": clip(message, MAX_MESSAGE_CHARS)}
    if data is not None:
        if isinstance(data, dict) and isinstance(data.get("message"), str):
            data = {**data, "message": clip(data["message"], MAX_MESSAGE_CHARS)}
        error["data"] = data
    return {"jsonrpc": "2.0", "id": request_id, "error": error}


def _valid_id(value: Any) -> bool:
    # bool is an int subclass; the spec allows string, number or null ids only.
    return value is None or (isinstance(value, (str, int, float)) and not isinstance(value, bool))


class Dispatcher:
    """Maps method names to async handlers and turns request bytes into response bytes (or None)."""

    def __init__(self, *, max_batch: int = 100, observer: CallObserver | None = None) -> None:
        self._methods: dict[str, tuple[Handler, inspect.Signature]] = {}
        self._max_batch = max_batch
        self._observer = observer

    def method(self, name: str) -> Callable[[Handler], Handler]:
        """Register an async handler under a JSON-RPC method name."""

        def register(handler: Handler) -> Handler:
            self._methods[name] = (handler, inspect.signature(handler))
            return handler

        return register

    @property
    def method_names(self) -> frozenset[str]:
        return frozenset(self._methods)

    async def handle(self, body: bytes) -> bytes | None:
        """Return the encoded response, or None when nothing must be sent (only notifications)."""
        try:
            payload = json.loads(body)
        except (ValueError, UnicodeDecodeError, RecursionError) as exc:
            return _encode(_error(None, PARSE_ERROR, "parse error", {"code": "rpc.parse", "message": str(exc)[:200]}))
        if isinstance(payload, list):
            if not payload:
                return _encode(_error(None, INVALID_REQUEST, "empty batch", _code("rpc.invalid_request")))
            if len(payload) > self._max_batch:
                return _encode(
                    _error(None, INVALID_REQUEST, f"batch larger than {self._max_batch}", _code("rpc.batch_size"))
                )
            answers: list[dict[str, Any] | None] = [None] * len(payload)

            async def answer(index: int) -> None:
                answers[index] = await self._handle_one(payload[index])

            # the spec lets a batch's calls run as concurrent tasks: submits in one batch then share a write
            async with trio.open_nursery() as nursery:
                for index in range(len(payload)):
                    nursery.start_soon(answer, index)
            responses = [response for response in answers if response is not None]
            return _encode(responses) if responses else None
        response = await self._handle_one(payload)
        return None if response is None else _encode(response)

    async def _handle_one(self, request: Any) -> dict[str, Any] | None:
        if not isinstance(request, dict):
            return _error(None, INVALID_REQUEST, "request must be an object", _code("rpc.invalid_request"))
        request_id = request.get("id")
        if not _valid_id(request_id):
            return _error(None, INVALID_REQUEST, "id must be a string, number or null", _code("rpc.invalid_request"))
        method = request.get("method")
        params = request.get("params", [])
        if request.get("jsonrpc") != "2.0" or not isinstance(method, str) or not isinstance(params, (list, dict)):
            return _error(request_id, INVALID_REQUEST, "not a JSON-RPC 2.0 request", _code("rpc.invalid_request"))
        is_notification = "id" not in request
        response = await self._call(method, params, request_id)
        return None if is_notification else response

    async def _call(self, method: str, params: list[Any] | dict[str, Any], request_id: Any) -> dict[str, Any]:
        started = time.perf_counter()
        entry = self._methods.get(method)
        if entry is None:
            self._observe("unknown", "method_not_found", started)
            message = f"method not found: {clip(method)}"
            return _error(request_id, METHOD_NOT_FOUND, message, _code("rpc.method_not_found"))
        handler, signature = entry
        unknown = _unknown_parameter(params, signature)
        if unknown is not None:  # said here: Python's TypeError would quote the whole name
            self._observe(method, "invalid_params", started)
            takes = ", ".join(signature.parameters) or "no parameters"
            message = f"unknown parameter: {clip(unknown)}; {method} takes {takes}"
            return _error(request_id, INVALID_PARAMS, message, {"code": "params.shape", "message": message})
        try:
            # Bind first so a TypeError raised inside the handler is not mistaken for bad params.
            bound = signature.bind(*params) if isinstance(params, list) else signature.bind(**params)
        except TypeError as exc:  # a missing parameter, or too many: names the method's own parameters only
            self._observe(method, "invalid_params", started)
            return _error(request_id, INVALID_PARAMS, str(exc), {"code": "params.shape", "message": str(exc)})
        try:
            result = await handler(*bound.args, **bound.kwargs)
        except RpcError as exc:
            self._observe(method, "invalid_params" if exc.code == INVALID_PARAMS else "error", started)
            return _error(request_id, exc.code, exc.message, exc.data)
        except LedgerError as exc:
            self._observe(method, "error", started)
            return _error(request_id, LEDGER_ERROR, exc.message, {"code": exc.code, "message": exc.message})
        except Exception:
            log.exception("rpc method %s failed", method)
            self._observe(method, "internal_error", started)
            return _error(request_id, INTERNAL_ERROR, INTERNAL_MESSAGE, _code("rpc.internal"))
        self._observe(method, "ok", started)
        return {"jsonrpc": "2.0", "id": request_id, "result": result}

    def _observe(self, method: str, outcome: str, started: float) -> None:
        if self._observer is not None:
            self._observer.observe_call(method, outcome, time.perf_counter() - started)


def _unknown_parameter(params: list[Any] | dict[str, Any], signature: inspect.Signature) -> str | None:
    """The first named parameter the method does not take, if any."""
    if isinstance(params, list):
        return None
    return next((name for name in params if name not in signature.parameters), None)


def _code(code: str) -> dict[str, str]:
    return {"code": code}


def _encode(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()
