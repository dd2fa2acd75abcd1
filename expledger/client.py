"""A typed client of a running node: one method per JSON-RPC method of docs/RPC.md.

It finds the daemon as the CLI does, through its home (`home`, else $EXPLEDGER_HOME, else ~/.expledger): the
URL in rpc.url, the token in rpc.cookie (rewritten at each daemon start), or takes `url` and `token` directly.
Every method returns the method's JSON result as a dict. Errors are exceptions: `RpcFailed` when the node
answered with an error (`rpc_code` the JSON-RPC code such as -32602, `code` the dotted code such as
"params.range", `data` the error's data), `DaemonUnavailable` when no daemon answers; both are
`ExpledgerError`s. Standard library only: importing it costs nothing an agent does not use.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from ledger.errors import LedgerError as ExpledgerError
from node import client as _rpc
from node.client import DaemonUnavailable, RpcFailed
from node.config import default_home
from node.home import Home

__all__ = ["Client", "DaemonUnavailable", "ExpledgerError", "RpcFailed"]

PROXY_URL_FILE = "proxy.url"


def _given(**params: Any) -> dict[str, Any]:
    """The parameters that were given (None: the node's default)."""
    return {name: value for name, value in params.items() if value is not None}


class Client(_rpc.Client):
    """Calls to one node. `Client()` uses the default home; `Client(url=..., token=...)` any node."""

    def __init__(
        self,
        home: str | Path | None = None,
        *,
        url: str | None = None,
        token: str | None = None,
        timeout: float = 60.0,
    ) -> None:
        self.home = Home(Path(home) if home is not None else default_home())
        if url is None or token is None:
            super().__init__(self.home, timeout)
        else:
            self.url, self._token, self._timeout = url, token, timeout

    @property
    def token(self) -> str:
        """The token this client presents: also the api_key of the node's OpenAI-compatible proxy."""
        return self._token

    @property
    def proxy_url(self) -> str:
        """The base URL of the node's OpenAI-compatible proxy (for `openai.OpenAI(base_url=...)`)."""
        try:
            return (self.home.path / PROXY_URL_FILE).read_text().strip()
        except FileNotFoundError:
            raise DaemonUnavailable(
                "proxy.not_running", f"no proxy runs on {self.home.path}: set [proxy] listen in its config.toml"
            ) from None

    # --- writing -----------------------------------------------------------------------------------------

    def submit(self, operation: str, encoding: Literal["hex", "base64"] = "hex") -> dict[str, Any]:
        return self.call("submit", operation=operation, encoding=encoding)

    def add(
        self,
        text: str,
        domain: str,
        confidence: float,
        examples: list[dict[str, Any]] | None = None,
        source: str | None = None,
    ) -> dict[str, Any]:
        return self.call(
            "add", **_given(text=text, domain=domain, confidence=confidence, examples=examples, source=source)
        )

    def modify(
        self,
        target: str,
        text: str | None = None,
        domain: str | None = None,
        confidence: float | None = None,
        examples: list[dict[str, Any]] | None = None,
        source: str | None = None,
    ) -> dict[str, Any]:
        fields = _given(text=text, domain=domain, confidence=confidence, examples=examples, source=source)
        return self.call("modify", target=target, **fields)

    def delete(self, target: str, reason: str) -> dict[str, Any]:
        return self.call("delete", target=target, reason=reason)

    def merge(
        self,
        targets: list[str],
        text: str,
        domain: str,
        confidence: float,
        reason: str,
        examples: list[dict[str, Any]] | None = None,
        source: str | None = None,
    ) -> dict[str, Any]:
        fields = _given(text=text, domain=domain, confidence=confidence, examples=examples, source=source)
        return self.call("merge", targets=targets, reason=reason, **fields)

    def vote(self, target: str, value: Literal[1, -1, "up", "down", "+1", "-1"]) -> dict[str, Any]:
        return self.call("vote", target=target, value=value)

    # --- reading -----------------------------------------------------------------------------------------

    def get(self, id: str, embedding: bool = False) -> dict[str, Any]:
        return self.call("get", id=id, embedding=embedding)

    def list(
        self,
        domain: str | None = None,
        author: str | None = None,
        status: Literal["live", "deleted", "alias"] | None = None,
        conflicted: bool | None = None,
        cursor: str | None = None,
        limit: int = 100,
    ) -> dict[str, Any]:
        filters = _given(domain=domain, author=author, status=status, conflicted=conflicted, cursor=cursor)
        return self.call("list", limit=limit, **filters)

    def history(self, id: str) -> dict[str, Any]:
        return self.call("history", id=id)

    # --- retrieval ---------------------------------------------------------------------------------------

    def retrieve(
        self, query: str, k: int = 5, threshold: float | None = None, domain: str | None = None
    ) -> dict[str, Any]:
        return self.call("retrieve", query=query, k=k, **_given(threshold=threshold, domain=domain))

    def context(
        self,
        query: str,
        k: int = 5,
        threshold: float | None = None,
        budget: int = 2048,
        domain: str | None = None,
    ) -> dict[str, Any]:
        return self.call("context", query=query, k=k, budget=budget, **_given(threshold=threshold, domain=domain))

    def coverage(self, queries: list[str], tau: float | None = None) -> dict[str, Any]:
        return self.call("coverage", queries=queries, **_given(tau=tau))

    def usage(self, id: str | None = None, limit: int = 20) -> dict[str, Any]:
        return self.call("usage", limit=limit, **_given(id=id))

    # --- the log -----------------------------------------------------------------------------------------

    def head(self) -> dict[str, Any]:
        return self.call("head")

    def proof_inclusion(self, cid: str, size: int | None = None) -> dict[str, Any]:
        return self.call("proof.inclusion", cid=cid, **_given(size=size))

    def proof_consistency(self, old_size: int, new_size: int | None = None) -> dict[str, Any]:
        return self.call("proof.consistency", old_size=old_size, **_given(new_size=new_size))

    def state_root(self) -> dict[str, Any]:
        return self.call("state_root")

    def audit(self) -> dict[str, Any]:
        """The library folded again by the reference fold and compared (slow: ~40 s per 100k operations)."""
        return self.call("audit")

    # --- the node and its peers --------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        return self.call("status")

    def peers(self) -> dict[str, Any]:
        return self.call("peers")

    def peers_connect(self, addr: str) -> dict[str, Any]:
        return self.call("peers.connect", addr=addr)

    def peers_disconnect(self, peer_id: str) -> dict[str, Any]:
        return self.call("peers.disconnect", peer_id=peer_id)

    def stop(self) -> dict[str, Any]:
        return self.call("stop")
