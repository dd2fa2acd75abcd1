"""docs/RPC.md's examples, replayed in document order against a fresh daemon: every documented answer is real.

The page marks its examples (see its introduction): `Request:` then a fenced block is a body POSTed to the
RPC URL with the token, `Request: GET /path` a GET; `Response:` then a ```json block is the HTTP 200 answer,
`Response: 204 No Content` an empty one; `Event:` then a ```json block is an event the /events websocket
delivers (matched by its `seq`).

How a documented value D is compared with the node's value A:
- objects have the same keys, arrays the same length, and their members compare recursively;
- under the keys `timestamp`, `uptime_seconds` and `free_bytes` (the disk's), D and A are numbers; under
  `created_at`, ISO-8601 UTC strings (they depend on the clock);
- under `score`, numbers within 1e-4 (a cosine through float32 arithmetic);
- a string that is a semantic version (`status.version`) matches any semantic version;
- any other string must match exactly, except for its *volatile tokens*: CIDs (`bafyrei…`), `did:key:…`
  identities, and 64- or 128-digit hex (hashes, roots, signatures). Such a token matches a token of the
  same form, and binds: the first time the page shows a token it is paired with what the node said, and
  from then on that pair is fixed in both directions (a documented CID that reappears must be the same
  actual CID, and two different documented CIDs must be two different actual ones);
- every other value (numbers, booleans, null) is equal, with the same JSON type.
Before a request is sent, each bound token in it is replaced by its actual value, so a documented request
that uses the CID of a documented `add` acts on what this run's `add` created.
"""

from __future__ import annotations

import json
import math
import re
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio
import websockets.sync.client

from node import api
from node.jsonrpc import Dispatcher
from tests.daemons import Daemon, init_home, running

RPC_MD = Path(__file__).resolve().parent.parent / "docs" / "RPC.md"

CID = r"bafyrei[a-z2-7]{52}"
DID = r"did:key:z[1-9A-HJ-NP-Za-km-z]{40,60}"
HEX = r"(?<![0-9a-f])(?:[0-9a-f]{128}|[0-9a-f]{64})(?![0-9a-f])"
VOLATILE = re.compile(f"{CID}|{DID}|{HEX}")
SEMVER = re.compile(r"\d+\.\d+\.\d+(?:[-+.][0-9A-Za-z.+-]+)?")
ISO_UTC = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ")
CLOCK_KEYS = {"timestamp", "uptime_seconds", "free_bytes"}
SCORE_TOLERANCE = 1e-4
NO_CONTENT = "204 No Content"
EVENT_TIMEOUT = 10.0


@dataclass
class Step:
    """One documented example: a request and its answer, or an event."""

    line: int  # in RPC.md, for the failure message
    kind: str  # "post", "get" or "event"
    request: str = ""  # the body (post) or the path (get)
    is_json: bool = False  # a ```json request (a ```text one is a deliberately malformed body)
    expected: Any = None  # the documented JSON, or None for 204 No Content


def _marked_blocks(text: str) -> list[tuple[int, str, str, str | None, str | None]]:
    """(line, label, rest of the marker line, fence language, block) for each marker line."""
    lines = text.splitlines()
    found = []
    index = 0
    while index < len(lines):
        marker = re.fullmatch(r"(Request|Response|Event):[ \t]*(.*)", lines[index])
        index += 1
        if marker is None:
            continue
        line, label, rest = index, marker.group(1), marker.group(2).strip()
        language = block = None
        if not rest:
            while index < len(lines) and not lines[index].strip():
                index += 1
            assert index < len(lines) and lines[index].startswith("```"), f"RPC.md:{line}: {label}: no block"
            language = lines[index][3:].strip()
            end = lines.index("```", index + 1)
            block = "\n".join(lines[index + 1 : end])
            index = end + 1
        found.append((line, label, rest, language, block))
    return found


def documented_steps(text: str) -> list[Step]:
    """The page's examples in order; each Request followed by its Response, Events on their own."""
    steps: list[Step] = []
    request: Step | None = None
    for line, label, rest, language, block in _marked_blocks(text):
        where = f"RPC.md:{line}"
        if label == "Request":
            assert request is None, f"{where}: a Request follows a Request without a Response"
            if block is None:
                verb, _, path = rest.partition(" ")
                assert verb == "GET" and path.startswith("/"), f"{where}: expected 'Request: GET /path'"
                request = Step(line, "get", path)
            else:
                assert language in ("json", "text"), f"{where}: a request block is ```json or ```text"
                if language == "json":
                    json.loads(block)  # a ```json request must be JSON
                request = Step(line, "post", block, is_json=language == "json")
        elif label == "Response":
            assert request is not None, f"{where}: a Response without a Request"
            if block is None:
                assert rest == NO_CONTENT, f"{where}: expected 'Response: {NO_CONTENT}' or a ```json block"
            else:
                assert language == "json", f"{where}: a response block is ```json"
                request.expected = json.loads(block)
            steps.append(request)
            request = None
        else:
            assert block is not None and language == "json", f"{where}: an Event is a ```json block"
            steps.append(Step(line, "event", expected=json.loads(block)))
    assert request is None, "RPC.md ends with a Request without a Response"
    return steps


class Matcher:
    """Compares documented values with actual ones, binding volatile tokens as it goes (see the module doc)."""

    def __init__(self) -> None:
        self.actual_of: dict[str, str] = {}
        self.documented_of: dict[str, str] = {}

    def substitute(self, request: str) -> str:
        """The documented request with every bound token replaced by this run's value."""
        return VOLATILE.sub(lambda token: self.actual_of.get(token.group(), token.group()), request)

    def compare(self, documented: Any, actual: Any, path: str = "$") -> None:
        key = path.rsplit(".", 1)[-1]
        if isinstance(documented, dict):
            self._expect(isinstance(actual, dict), path, documented, actual)
            missing, extra = sorted(documented.keys() - actual.keys()), sorted(actual.keys() - documented.keys())
            self._expect(
                not missing and not extra, path, f"keys {sorted(documented)}", f"missing {missing}, new {extra}"
            )
            for name, value in documented.items():
                self.compare(value, actual[name], f"{path}.{name}")
        elif isinstance(documented, list):
            self._expect(isinstance(actual, list) and len(actual) == len(documented), path, documented, actual)
            for index, (value, got) in enumerate(zip(documented, actual, strict=True)):
                self.compare(value, got, f"{path}[{index}]")
        elif key in CLOCK_KEYS:
            self._expect(_is_number(documented) and _is_number(actual), path, "a number", actual)
        elif key == "created_at":
            self._expect(isinstance(actual, str) and ISO_UTC.fullmatch(actual) is not None, path, "a UTC time", actual)
        elif key == "score" and _is_number(documented):
            close = _is_number(actual) and math.isclose(documented, actual, rel_tol=0, abs_tol=SCORE_TOLERANCE)
            self._expect(close, path, documented, actual)
        elif isinstance(documented, str) and SEMVER.fullmatch(documented):
            self._expect(isinstance(actual, str) and SEMVER.fullmatch(actual) is not None, path, "a version", actual)
        elif isinstance(documented, str):
            self._expect(isinstance(actual, str), path, documented, actual)
            self._compare_text(documented, actual, path)
        else:
            same_type = (_is_number(documented) and _is_number(actual)) or type(documented) is type(actual)
            self._expect(same_type and documented == actual, path, documented, actual)

    def _compare_text(self, documented: str, actual: str, path: str) -> None:
        """Literal text must be equal; each volatile token matches a token of its form, bound to it."""
        pattern, tokens, end = [], [], 0
        for token in VOLATILE.finditer(documented):
            pattern.append(re.escape(documented[end : token.start()]))
            if token.group() in self.actual_of:
                pattern.append(re.escape(self.actual_of[token.group()]))
            else:
                pattern.append(f"({_form_of(token.group())})")
                tokens.append(token.group())
            end = token.end()
        pattern.append(re.escape(documented[end:]))
        match = re.fullmatch("".join(pattern), actual)
        self._expect(match is not None, path, documented, actual)
        assert match is not None
        for token, value in zip(tokens, match.groups(), strict=True):
            bound = self.actual_of.setdefault(token, value)
            self._expect(bound == value, path, f"{token} (again, bound to {bound})", value)
            back = self.documented_of.setdefault(value, token)
            self._expect(back == token, path, f"{token}, a token not shown before", f"{value}, which was {back}")

    @staticmethod
    def _expect(condition: bool, path: str, documented: Any, actual: Any) -> None:
        if not condition:
            raise AssertionError(f"at {path}: documented {documented!r}, the node gave {actual!r}")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _form_of(token: str) -> str:
    """The pattern of a token's form, so a CID only ever matches a CID (and a hash a hash of its length)."""
    if re.fullmatch(CID, token):
        return CID
    if re.fullmatch(DID, token):
        return DID
    return f"[0-9a-f]{{{len(token)}}}"


def registered_methods() -> frozenset[str]:
    """The method names node.api registers (until a method runs, register() only touches `node.ledger.params`
    and `node.metrics.set_known_methods`, so a stand-in node will do)."""
    dispatcher = Dispatcher()
    stand_in = types.SimpleNamespace(
        ledger=types.SimpleNamespace(params=None), metrics=types.SimpleNamespace(set_known_methods=lambda names: None)
    )
    api.register(dispatcher, stand_in, trio.Event())  # type: ignore[arg-type]
    return dispatcher.method_names


def documented_methods(steps: list[Step]) -> set[str]:
    methods = set()
    for step in steps:
        if step.is_json:
            body = json.loads(step.request)
            methods.update(call["method"] for call in (body if isinstance(body, list) else [body]))
    return methods


def test_every_method_is_documented_with_a_section_and_an_example():
    text = RPC_MD.read_text()
    methods = registered_methods()
    assert methods >= {"submit", "get", "stop"}  # the stand-in really ran register()
    undocumented = sorted(methods - documented_methods(documented_steps(text)))
    assert not undocumented, f"no example request in docs/RPC.md for {undocumented}"
    sections = set(re.findall(r"^##+ `([^`]+)`$", text, flags=re.MULTILINE))
    without_section = sorted(methods - sections)
    assert not without_section, f"no section in docs/RPC.md for {without_section}"


def _run(daemon: Daemon, step: Step, matcher: Matcher) -> None:
    if step.kind == "get":
        response = daemon.http.get(daemon.url + step.request.lstrip("/"))
    else:
        body = matcher.substitute(step.request).encode()
        response = daemon.http.post(daemon.url, content=body, headers={"Content-Type": "application/json"})
    if step.expected is None:
        assert (response.status_code, response.content) == (204, b""), (response.status_code, response.text)
        return
    assert response.status_code == 200, (response.status_code, response.text)
    matcher.compare(step.expected, response.json())


def _next_event(events: websockets.sync.client.ClientConnection, seq: int, seen: dict[int, Any]) -> Any:
    """The event numbered `seq`, reading (and keeping) the ones before it."""
    while seq not in seen:
        event = json.loads(events.recv(timeout=EVENT_TIMEOUT))
        assert event.get("type") == "operation", event  # a "lagged" notice would mean events were dropped
        seen[event["seq"]] = event
    return seen[seq]


def test_every_documented_example_is_what_the_node_answers(tmp_path):
    steps = documented_steps(RPC_MD.read_text())
    assert steps, "no marked examples in docs/RPC.md"
    home = tmp_path / "home"
    init_home(home)
    matcher, seen = Matcher(), {}
    with running(home) as daemon:
        # subscribed before the first request, so every event of the session reaches this socket
        uri = daemon.url.replace("http", "ws", 1) + "events?token=" + daemon.token
        with websockets.sync.client.connect(uri, open_timeout=10) as events:
            for step in steps:
                try:
                    if step.kind == "event":
                        matcher.compare(step.expected, _next_event(events, step.expected["seq"], seen))
                    else:
                        _run(daemon, step, matcher)
                except AssertionError as exc:
                    raise AssertionError(f"docs/RPC.md:{step.line}: {exc}") from None
        assert json.loads(steps[-1].request)["method"] == "stop"  # the page ends the session
        assert daemon.process.wait(30) == 0  # as documented, the daemon exits with status 0
