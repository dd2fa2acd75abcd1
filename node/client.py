"""The CLI's side of the RPC: find the daemon through its home, call it, show the answer.

Uses only the standard library (`urllib`): one CLI call costs ~50 ms, against ~165 ms with httpx,
whose import and first client alone take ~140 ms.
"""

from __future__ import annotations

import argparse
import itertools
import json
import shutil
import sys
import textwrap
import time
import urllib.error
import urllib.request
from typing import Any

from ledger.errors import LedgerError
from node.home import Home

_ids = itertools.count(1)


class DaemonUnavailable(LedgerError):
    """No daemon runs on the home, or it does not answer."""


class RpcFailed(LedgerError):
    """The daemon answered with an error; `data` is the JSON-RPC error's data (its `code` is the dotted code)."""

    def __init__(self, code: str, message: str, rpc_code: int, data: Any = None) -> None:
        super().__init__(code, message)
        self.rpc_code = rpc_code
        self.data = data


class Client:
    """JSON-RPC calls to the daemon of one home, authenticated with the cookie it wrote at start."""

    def __init__(self, home: Home, timeout: float = 60.0) -> None:
        home.require()
        try:
            self.url = home.url_file.read_text().strip()
            cookie = home.cookie_file.read_text().strip()
        except FileNotFoundError:
            raise DaemonUnavailable(
                "daemon.not_running",
                f"no daemon is running on {home.path}; start one with `expledger daemon --home {home.path}`",
            ) from None
        self._token = cookie.partition(":")[2]
        self._timeout = timeout

    def call(self, method: str, **params: Any) -> Any:
        answer = self._post({"jsonrpc": "2.0", "id": next(_ids), "method": method, "params": params})
        return _result(answer)

    def batch(self, method: str, calls: list[dict[str, Any]]) -> list[Any]:
        """`method` once per parameters of `calls`, in JSON-RPC batches of at most BATCH calls (the server's
        limit); the results in the order of `calls`, the first error raised."""
        results: list[Any] = []
        for start in range(0, len(calls), BATCH):
            requests = [
                {"jsonrpc": "2.0", "id": next(_ids), "method": method, "params": params}
                for params in calls[start : start + BATCH]
            ]
            answered = self._post(requests)
            if not isinstance(answered, list):  # the server refused the batch whole: its one error is raised
                _result(answered)
                raise RpcFailed("rpc.batch", "the daemon answered a batch with a single result", -32603)
            answers = {answer.get("id"): answer for answer in answered}
            results.extend(_result(answers[request["id"]]) for request in requests)
        return results

    def _post(self, payload: Any) -> Any:
        body = json.dumps(payload).encode()
        request = urllib.request.Request(
            self.url,
            data=body,
            method="POST",
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {self._token}"},
        )
        try:
            with urllib.request.urlopen(request, timeout=self._timeout) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as exc:
            if exc.code == 401:
                raise DaemonUnavailable(
                    "daemon.unauthorized", f"{self.url} refused the cookie's token: was the daemon restarted meanwhile?"
                ) from None
            raise DaemonUnavailable("daemon.http", f"{self.url} answered HTTP {exc.code} {exc.reason}") from None
        except (TimeoutError, urllib.error.URLError, ConnectionError) as exc:
            reason = getattr(exc, "reason", exc)
            raise DaemonUnavailable(
                "daemon.unreachable",
                f"the daemon at {self.url} does not answer ({reason}); is it running? (its rpc.url may be stale)",
            ) from None


#: calls per JSON-RPC batch: the server's limit (node/jsonrpc.py)
BATCH = 100


def _result(answer: dict[str, Any]) -> Any:
    """A JSON-RPC response's result, or its error raised as RpcFailed."""
    if "error" in answer:
        error = answer["error"]
        data = error.get("data")
        code = data.get("code") if isinstance(data, dict) and data.get("code") else f"rpc.{error['code']}"
        raise RpcFailed(code, error["message"], error["code"], data)
    return answer["result"]


# --- the CLI's node commands -----------------------------------------------------------------------

EXIT_REFUSED = 1  # the node answered with an error (an operation rejected, an unknown id)
EXIT_UNAVAILABLE = 3  # no daemon answers on this home


def add_commands(commands: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """The subcommands that call a running daemon (`expledger status`, `add`, `get`, ...)."""

    def command(name: str, help_text: str) -> argparse.ArgumentParser:
        parser = commands.add_parser(name, help=help_text, parents=[common])
        parser.set_defaults(client_command=name)
        return parser

    command("status", "the node: network, log size, pending operations, library and index")

    def content_flags(parser: argparse.ArgumentParser, required: bool) -> None:
        parser.add_argument("--text", required=required, help="the insight, e.g. 'When …, …'")
        parser.add_argument("--domain", required=required, help="taxonomy path, e.g. math.geometry")
        parser.add_argument("--confidence", type=float, required=required, help="in [0, 1]")
        parser.add_argument(
            "--example", action="append", metavar="JSON", help='{"input": …, "output": …, "correct": …}'
        )
        parser.add_argument("--source", help="provenance")

    content_flags(command("add", "add an experience (signed by the node's author key)"), True)
    modify = command("modify", "publish a new version of an experience (unset fields keep the current ones)")
    modify.add_argument("target", metavar="ID")
    content_flags(modify, False)
    delete = command("delete", "delete an experience")
    delete.add_argument("target", metavar="ID")
    delete.add_argument("--reason", required=True)
    merge = command("merge", "merge experiences into one new experience")
    merge.add_argument("targets", metavar="ID", nargs="+")
    content_flags(merge, True)
    merge.add_argument("--reason", required=True)
    vote = command("vote", "vote an experience up or down")
    vote.add_argument("target", metavar="ID")
    vote.add_argument("value", choices=["up", "down", "+1", "-1"])
    get = command("get", "one experience: its JSON view, status, versions, votes and inclusion proof")
    get.add_argument("id", metavar="ID")
    get.add_argument("--embedding", action="store_true", help="include the embedding's values")
    listing = command("list", "experiences, filtered, a page at a time")
    listing.add_argument("--domain", help="this domain and those under it")
    listing.add_argument("--author", help="created by this did:key")
    listing.add_argument("--status", choices=["live", "deleted", "alias"])
    listing.add_argument("--conflicted", action=argparse.BooleanOptionalAction, default=None)
    listing.add_argument("--cursor", help="the next_cursor of the previous page")
    listing.add_argument("--limit", type=int, default=100)
    history = command("history", "every operation on an experience, in fold order")
    history.add_argument("id", metavar="ID")
    for name, help_text in (("retrieve", "the experiences most relevant to a query"), ("context", "the prompt prefix")):
        parser = command(name, help_text)
        parser.add_argument("query")
        parser.add_argument("-k", type=int, default=5, help="how many experiences at most (default 5)")
        parser.add_argument("--threshold", type=float, help="the relevance floor (default: the network's)")
        parser.add_argument("--domain", help="only this domain and those under it")
        if name == "context":
            parser.add_argument("--budget", type=int, default=2048, help="tokens the prompt may use")
    top = command("top", "the experiences this node served most (retrieve, context, proxy), with their domains")
    top.add_argument("-n", "--limit", type=int, default=20, help="how many (default 20)")
    command("head", "the node's signed tree head")
    proof = command("proof", "RFC 9162 proofs from the node's log")
    proof.add_argument("kind", choices=["inclusion", "consistency"])
    proof.add_argument("subject", metavar="CID|OLD_SIZE", help="inclusion: the operation; consistency: the old size")
    proof.add_argument("--size", type=int, help="the tree size to prove against (default: the current one)")
    submit = command("submit", "submit a signed operation (a file of raw or hex DAG-CBOR, or hex)")
    submit.add_argument("source", metavar="FILE|HEX")
    command("stop", "stop the daemon gracefully")
    command("peers", "the peer table: connection, node, operations received, invalid, sync position")
    connect = command("connect", "dial a peer now (it is not redialled; add it to [p2p] bootstrap for that)")
    connect.add_argument("addr", metavar="MULTIADDR", help="ending in /p2p/PEERID (see `expledger id`)")
    disconnect = command("disconnect", "close the connection to a peer (a bootstrap peer is redialled)")
    disconnect.add_argument("peer_id", metavar="PEERID")


def _params(args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    """The RPC method and parameters a command calls."""
    name = args.client_command
    if name in ("add", "modify", "merge"):
        fields = {
            key: getattr(args, key)
            for key in ("text", "domain", "confidence", "source")
            if getattr(args, key) is not None
        }
        if args.example:
            fields["examples"] = [json.loads(item) for item in args.example]
        if name == "modify":
            return name, {"target": args.target, **fields}
        if name == "merge":
            return name, {"targets": args.targets, "reason": args.reason, **fields}
        return name, fields
    simple: dict[str, dict[str, Any]] = {
        "status": {},
        "peers": {},
        "connect": {"addr": getattr(args, "addr", None)},
        "disconnect": {"peer_id": getattr(args, "peer_id", None)},
        "head": {},
        "stop": {},
        "delete": {"target": getattr(args, "target", None), "reason": getattr(args, "reason", None)},
        "vote": {"target": getattr(args, "target", None), "value": getattr(args, "value", None)},
        "get": {"id": getattr(args, "id", None), "embedding": getattr(args, "embedding", False)},
        "history": {"id": getattr(args, "id", None)},
    }
    if name in simple:
        return {"connect": "peers.connect", "disconnect": "peers.disconnect"}.get(name, name), simple[name]
    if name == "top":
        return "usage", {"limit": args.limit}
    if name == "list":
        found = {key: getattr(args, key) for key in ("domain", "author", "status", "conflicted", "cursor")}
        return name, {"limit": args.limit, **{key: value for key, value in found.items() if value is not None}}
    if name in ("retrieve", "context"):
        query = {"query": args.query, "k": args.k, "threshold": args.threshold, "domain": args.domain}
        if name == "context":
            query["budget"] = args.budget
        return name, {key: value for key, value in query.items() if value is not None}
    if name == "proof":
        if args.kind == "inclusion":
            return "proof.inclusion", {"cid": args.subject, **({"size": args.size} if args.size else {})}
        return "proof.consistency", {"old_size": int(args.subject), **({"new_size": args.size} if args.size else {})}
    raise AssertionError(f"no RPC for {name}")


def run_command(args: argparse.Namespace, operation: bytes | None = None) -> int:
    """Call the daemon for one command and print the answer (`--json`: the result as JSON)."""
    method, params = ("submit", {"operation": operation.hex()}) if operation is not None else _params(args)
    try:
        client = Client(Home(args.home))
        result = client.call(method, **params)
        if method == "list" and not args.json:  # the records carry no text: one batch of `get`s fetches it
            texts = client.batch("get", [{"id": record["id"]} for record in result["experiences"]])
            result = {**result, "texts": [view["text"] for view in texts]}
    except DaemonUnavailable as exc:
        print(f"expledger: error: {exc.code}: {exc.message}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    except RpcFailed as exc:
        print(f"expledger: error: {exc.code}: {exc.message}", file=sys.stderr)
        if args.json and exc.data is not None:
            print(json.dumps(exc.data, indent=2))
        return EXIT_REFUSED
    if method == "stop":
        return _wait_until_stopped(Home(args.home))
    if args.json:
        print(json.dumps(result, indent=2, ensure_ascii=False))
    else:
        print(render(method, result))
    return 0


def _wait_until_stopped(home: Home, timeout: float = 120.0) -> int:
    """`stop` returns once the daemon has finished (its pid file is gone): the next command may use the home."""
    deadline = time.monotonic() + timeout
    while home.pid_file.exists():
        if time.monotonic() > deadline:
            print(f"expledger: error: daemon.stop: still running after {timeout:.0f} s", file=sys.stderr)
            return EXIT_UNAVAILABLE
        time.sleep(0.05)
    print("stopped")
    return 0


def render(method: str, result: Any, width: int | None = None) -> str:
    """The answer for people: a line, a few `name: value` lines, or a table; experiences' texts are wrapped to
    `width` columns (default: the terminal's, else $COLUMNS or 80), never cut."""
    width = width or shutil.get_terminal_size().columns
    if method in ("add", "modify", "delete", "merge", "vote", "submit"):
        code = f" ({result['code']})" if result["code"] else ""
        return f"{result['outcome']}{code} {result['kind']} {result['cid']}"
    if method == "get":
        library = result["library"]
        lines = [
            f"{result['text']}",
            f"id: {result['id']}",
            f"domain: {result['domain']}    confidence: {result['confidence']}",
            f"status: {library['status']}    version: {library['version']}",
            f"conflicted: {'yes, heads ' + ', '.join(library['heads']) if library['conflicted'] else 'no'}",
            f"support: {library['support']}    votes: +{library['votes']['upvotes']} -{library['votes']['downvotes']}",
            f"created by {result['metadata']['created_by']} at {result['metadata']['created_at']}",
        ]
        return "\n".join(lines)
    if method == "list":
        rows = [
            [
                r["id"],
                r["status"],
                r["domain"],
                str(r["support"]),
                f"+{r['votes']['upvotes']}/-{r['votes']['downvotes']}",
            ]
            for r in result["experiences"]
        ]
        table = _table(["ID", "STATUS", "DOMAIN", "SUPPORT", "VOTES"], rows)
        if "texts" in result:
            table = _with_texts(table, result["texts"], 4, width)
        return table + (f"\nmore: --cursor {result['next_cursor']}" if result["next_cursor"] else "")
    if method == "history":
        rows = [
            [str(o["clock"]), o["kind"], o["status"]["outcome"], o["cid"], _cut(o.get("text", ""), 60)]
            for o in result["operations"]
        ]
        return _table(["CLOCK", "KIND", "OUTCOME", "CID", "TEXT"], rows)
    if method == "usage":
        rows = [
            [
                str(e["usage_count"]),
                e["id"],
                e["domain"] or "-",
                ",".join(e["domains_applied"]),
                _cut(e["text"] or "", 50),
            ]
            for e in result["experiences"]
        ]
        return _table(["SERVED", "ID", "DOMAIN", "SERVED FOR", "TEXT"], rows) if rows else "nothing served yet"
    if method == "retrieve":
        if not result["hits"]:
            return "no experience above the threshold"
        rows = [[f"{h['score']:.3f}", h["id"], h["domain"]] for h in result["hits"]]
        table = _table(["SCORE", "ID", "DOMAIN"], rows)
        return _with_texts(table, [h["text"] for h in result["hits"]], len("SCORE  "), width)
    if method == "context":
        return result["prompt"]
    if method == "peers":
        sync = result["self"]["sync"]
        rows = [
            [
                p["peer_id"],
                "banned" if p["banned_for"] else ("connected" if p["connected"] else "-"),
                _cut(p["node"], 24) or "-",
                str(p["operations_received"]),
                str(p["invalid"]),
                str(p["sync"]["fetched"]),
                str(p["sync"]["head"]),
                p["sync"]["state"],
            ]
            for p in result["peers"]
        ]
        mine = f"peer {result['self']['peer_id']}: {sync['state']} ({sync['behind']} behind, {sync['orphans']} orphans)"
        return mine + "\n" + _table(["PEER", "STATE", "NODE", "OPS IN", "INVALID", "FETCHED", "HEAD", "SYNC"], rows)
    return "\n".join(
        f"{key}: {json.dumps(value) if isinstance(value, (dict, list)) else value}" for key, value in result.items()
    )


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


#: the narrowest a wrapped text gets, however narrow the terminal
_MIN_TEXT_WIDTH = 30


def _with_texts(table: str, texts: list[str], indent: int, width: int) -> str:
    """Each row of `table` (a header line, then one line per row) followed by its text, indented by `indent`
    and wrapped to `width` columns: the whole text, readable in any terminal."""
    header, *rows = table.split("\n")
    margin = " " * indent
    lines = [header]
    for row, text in zip(rows, texts, strict=True):
        wrapped = textwrap.wrap(
            text,
            max(width, indent + _MIN_TEXT_WIDTH),
            initial_indent=margin,
            subsequent_indent=margin,
            break_on_hyphens=False,
        )
        lines.extend([row, *wrapped])
    return "\n".join(lines)


def _table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in [header, *rows]
    )
