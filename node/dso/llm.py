"""A client for any OpenAI-compatible chat-completions endpoint (llama.cpp, vLLM, Ollama, a hosted API).

Built on the `openai` package with its own retries turned off: this module retries time-outs,
connection errors, 429 and 5xx answers itself, with exponential backoff (honouring Retry-After),
so each attempt is logged and counted and an endpoint that stays down ends in one clear error.
JSON output is constrained with `response_format` when the server takes it; a server that refuses
a format is asked again with a simpler one (JSON schema, then JSON object, then plain text), and
the answer is parsed tolerantly either way (node.dso.parsing). A server that took the format but could
not parse what the model wrote under it (llama.cpp's HTTP 500 "The model produced output that does not
match the expected … format") has not refused the format: that one answer failed, and is reported as such
(LlmOutputError), neither retried (at temperature 0 the model would write it again) nor stepped down.
"""

from __future__ import annotations

import logging
import os
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ledger.errors import LedgerError
from node.config import LLM_RESPONSE_FORMATS, LlmConfig

log = logging.getLogger("expledger.dso.llm")

ENV_BASE_URL = "EXPLEDGER_LLM_BASE_URL"
ENV_MODEL = "EXPLEDGER_LLM_MODEL"
ENV_API_KEY = "EXPLEDGER_LLM_API_KEY"
#: local servers want no key, but the openai package refuses to start without one
NO_KEY = "no-key"
BACKOFF_FIRST = 0.5  # seconds before the first retry; doubled each time
BACKOFF_MOST = 30.0
_FORMATS_AFTER = {"json_schema": "json_object", "json_object": "none"}
#: what llama.cpp's server says when the answer generated under a response_format fails its own parser
_OUTPUT_FAILED = "produced output that does not match"


class LlmError(LedgerError):
    """The endpoint could not give an answer: unreachable, refusing, or misconfigured."""


class LlmOutputError(LlmError):
    """The server took the request but failed on what the model wrote: this answer is lost, not the endpoint."""


@dataclass(frozen=True, slots=True)
class LlmSettings:
    """Where and how to call the model: config.toml's [llm], overridden by the environment."""

    base_url: str
    model: str
    api_key: str
    timeout: float
    max_retries: int
    response_format: str

    @classmethod
    def resolve(cls, config: LlmConfig, environ: Mapping[str, str] = os.environ, **overrides: Any) -> LlmSettings:
        """Config, then EXPLEDGER_LLM_* variables, then explicit overrides (command-line flags) that are not None."""
        values = {
            "base_url": environ.get(ENV_BASE_URL) or config.base_url,
            "model": environ.get(ENV_MODEL) or config.model,
            "api_key": environ.get(ENV_API_KEY) or config.api_key or environ.get("OPENAI_API_KEY") or NO_KEY,
            "timeout": float(config.timeout),
            "max_retries": config.max_retries,
            "response_format": config.response_format,
        }
        values.update({key: value for key, value in overrides.items() if value is not None})
        if values["response_format"] not in LLM_RESPONSE_FORMATS:
            raise LlmError(
                "llm.config", f"response_format: {values['response_format']!r} is not one of {LLM_RESPONSE_FORMATS}"
            )
        return cls(**values)


@dataclass(frozen=True, slots=True)
class Completion:
    text: str
    prompt_tokens: int
    completion_tokens: int
    seconds: float
    attempts: int
    #: the answer was cut off at max_tokens (finish_reason "length")
    truncated: bool = False


@dataclass(slots=True)
class StageUsage:
    """What the calls made for one purpose (a DSO stage, rollouts, curation) cost."""

    calls: int = 0
    seconds: float = 0.0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    retries: int = 0
    #: answers cut off at max_tokens, and answers the server failed on (LlmOutputError)
    truncated: int = 0
    failed: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "calls": self.calls,
            "seconds": round(self.seconds, 3),
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "retries": self.retries,
            "truncated": self.truncated,
            "failed": self.failed,
        }


@dataclass(eq=False)
class LlmClient:
    """Chat completions with retries, backoff, format negotiation and per-purpose usage counts."""

    settings: LlmSettings
    sleep: Callable[[float], None] = time.sleep
    usage: dict[str, StageUsage] = field(default_factory=dict)
    _client: Any = field(default=None, repr=False)
    _model: str = ""
    _format: str = ""

    def __post_init__(self) -> None:
        import openai  # ~1 s to import: only a command or curator that calls a model pays for it

        self._openai = openai
        self._client = openai.OpenAI(
            base_url=self.settings.base_url,
            api_key=self.settings.api_key,
            timeout=self.settings.timeout,
            max_retries=0,
        )
        self._format = "json_schema" if self.settings.response_format == "auto" else self.settings.response_format

    @property
    def model(self) -> str:
        """The model asked for, or the endpoint's first model when none is configured."""
        if not self._model:
            self._model = self.settings.model or self._first_model()
        return self._model

    def _first_model(self) -> str:
        listed = self._with_retries("models", lambda: self._client.models.list())
        models = [item.id for item in listed.data]
        if not models:
            raise LlmError("llm.model", f"{self.settings.base_url} serves no model; set [llm] model or {ENV_MODEL}")
        return models[0]

    def complete(
        self,
        messages: list[dict[str, str]],
        *,
        purpose: str,
        temperature: float = 0.0,
        max_tokens: int = 512,
        schema: dict[str, Any] | None = None,
    ) -> Completion:
        """One chat completion. `schema` asks for JSON of that shape when the server supports it."""
        model = self.model
        started = time.perf_counter()
        usage = self.usage.setdefault(purpose, StageUsage())
        attempts = 0

        def call() -> Any:
            nonlocal attempts
            attempts += 1
            while True:
                options: dict[str, Any] = {}
                if schema is not None and self._format != "none":
                    options["response_format"] = _response_format(self._format, schema)
                try:
                    return self._client.chat.completions.create(
                        model=model, messages=messages, temperature=temperature, max_tokens=max_tokens, **options
                    )
                except self._openai.APIStatusError as exc:
                    if _OUTPUT_FAILED in _said(exc).lower():
                        raise LlmOutputError(
                            "llm.bad_output", f"{self.settings.base_url} failed on the model's answer: {_said(exc)}"
                        ) from None
                    refused = exc.status_code in (400, 422, 500, 501)
                    if not (options and refused and self.settings.response_format == "auto"):
                        raise
                    simpler = _FORMATS_AFTER[self._format]
                    log.warning(
                        "llm: %s refused response_format %s (HTTP %d); asking with %s from now on",
                        self.settings.base_url,
                        self._format,
                        exc.status_code,
                        simpler,
                    )
                    self._format = simpler

        try:
            response = self._with_retries(purpose, call)
        except LlmOutputError:
            usage.calls += 1
            usage.seconds += time.perf_counter() - started
            usage.retries += attempts - 1
            usage.failed += 1
            raise
        seconds = time.perf_counter() - started
        choices = getattr(response, "choices", None) or []
        text = (choices[0].message.content or "") if choices else ""
        truncated = bool(choices) and getattr(choices[0], "finish_reason", None) == "length"
        counted = getattr(response, "usage", None)
        prompt_tokens = getattr(counted, "prompt_tokens", 0) or 0
        completion_tokens = getattr(counted, "completion_tokens", 0) or 0
        usage.calls += 1
        usage.seconds += seconds
        usage.prompt_tokens += prompt_tokens
        usage.completion_tokens += completion_tokens
        usage.retries += attempts - 1
        usage.truncated += truncated
        return Completion(text, prompt_tokens, completion_tokens, seconds, attempts, truncated)

    def _with_retries(self, purpose: str, call: Callable[[], Any]) -> Any:
        """`call()`, retried on what may pass (time-out, connection, 429, 5xx); LlmError once retries run out."""
        openai, base = self._openai, self.settings.base_url
        attempts = 1 + self.settings.max_retries
        for attempt in range(1, attempts + 1):
            try:
                return call()
            except openai.AuthenticationError as exc:
                why = f"{base} refused the API key (HTTP {exc.status_code}); set {ENV_API_KEY}"
                raise LlmError("llm.auth", why) from None
            except openai.APIStatusError as exc:
                if exc.status_code < 500 and exc.status_code != 429:
                    raise LlmError(
                        "llm.refused", f"{base} refused the request (HTTP {exc.status_code}): {_said(exc)}"
                    ) from None
                failure: Exception = exc
            except openai.APIConnectionError as exc:  # time-outs included
                failure = exc
            except ValueError as exc:  # a body that is not the JSON of a completion (a proxy's error page)
                failure = exc
            why = _why(failure)
            if attempt == attempts:
                if isinstance(failure, openai.APIConnectionError):
                    raise LlmError(
                        "llm.unreachable",
                        f"the LLM endpoint {base} failed {attempts} times ({why}); is the server running? "
                        f"Set [llm] base_url in config.toml or {ENV_BASE_URL}",
                    )
                raise LlmError("llm.failed", f"the LLM endpoint {base} failed {attempts} times ({why})")
            delay = _retry_after(failure) or min(BACKOFF_MOST, BACKOFF_FIRST * 2 ** (attempt - 1))
            delay *= 1 + random.random() / 4  # jitter: clients that failed together do not retry together
            log.warning(
                "llm: %s: attempt %d of %d failed (%s); retrying in %.1f s",
                purpose,
                attempt,
                attempts,
                why,
                delay,
            )
            self.sleep(delay)
        raise AssertionError("unreachable")


def _response_format(kind: str, schema: dict[str, Any]) -> dict[str, Any]:
    if kind == "json_schema":
        return {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": False}}
    return {"type": "json_object"}


def _why(exc: Exception) -> str:
    status = getattr(exc, "status_code", None)
    if status is not None:
        return f"HTTP {status}"
    if isinstance(exc, ValueError):
        return f"a malformed answer: {exc}"
    return "timed out" if "Timeout" in type(exc).__name__ else f"connection failed: {exc}"


def _said(exc: Any) -> str:
    return str(getattr(exc, "message", exc))[:300]


def _retry_after(exc: Exception) -> float | None:
    """The server's Retry-After (seconds), when a 429 or 503 says how long to wait; capped."""
    response = getattr(exc, "response", None)
    value = response.headers.get("retry-after") if response is not None else None
    try:
        return min(BACKOFF_MOST, max(0.0, float(value))) if value else None
    except ValueError:
        return None
