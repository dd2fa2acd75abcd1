"""The node's JSON-RPC methods (documented with examples in docs/RPC.md).

Each method checks its parameters (a bad one is -32602 naming it), runs ledger work on a reader
thread or through the ingest queue, and answers with plain JSON. Operations made here are signed
by the node's author key and built on the node's heads, so they take effect unless a conflict
rule says otherwise.
"""

from __future__ import annotations

import base64
import binascii
import importlib.metadata
import logging
import math
import re
import time
from typing import TYPE_CHECKING, Any

import trio

from ledger.audit import audit as audit_view
from ledger.audit import every
from ledger.cid import CID, CIDError
from ledger.errors import LedgerError
from ledger.ingest import Receipt, Source, Submission, Verdict
from ledger.jsonview import JsonViewError, experience_from_json, experience_json
from ledger.local_model import NETWORK
from ledger.merkle import ProofError
from ledger.ops import Block, Experience, Kind
from ledger.records import ExperienceRecord, Life
from ledger.retrieval import DEFAULT_BUDGET, DEFAULT_K, INLINE_EMBED, Hit
from ledger.view import LedgerView
from node.jsonrpc import (
    BUSY,
    ECHO_CHARS,
    INTERNAL_ERROR,
    INVALID_PARAMS,
    NOT_FOUND,
    REJECTED,
    STOPPING,
    UNAVAILABLE,
    UNWRITABLE,
    Dispatcher,
    RpcError,
    clip,
    invalid_params,
)
from node.service import STORE_UNWRITABLE, Busy, IngestFailed, Node, Stopping
from node.usage import Usage, UsageError, UsageStats

if TYPE_CHECKING:
    from p2p.service import P2PNode

log = logging.getLogger("expledger.api")
VERSION = importlib.metadata.version("experience-ledger")
#: seconds between the progress lines an audit logs
AUDIT_PROGRESS_SECONDS = 10.0
MAX_QUERY_CHARS = 10_000
MAX_QUERIES = 1_000
MAX_LIST = 1_000
MAX_TOP = 1_000
_SURROGATE = re.compile("[\ud800-\udfff]")


# --- parameter checks -----------------------------------------------------------------------------


def _text(value: Any, field: str, limit: int = MAX_QUERY_CHARS, *, empty: bool = False) -> str:
    if not isinstance(value, str):
        raise invalid_params(field, f"expected a string, got {_type(value)}")
    if _SURROGATE.search(value):
        raise invalid_params(field, "holds a lone surrogate (not UTF-8 text)", "params.utf8")
    if len(value) > limit:
        raise invalid_params(field, f"longer than {limit} characters", "params.range")
    if not empty and not value.strip():
        raise invalid_params(field, "is empty", "params.range")
    return value


def _integer(value: Any, field: str, low: int, high: int) -> int:
    if type(value) is not int:
        raise invalid_params(field, f"expected an integer, got {_type(value)}")
    if not low <= value <= high:
        raise invalid_params(field, f"{clip(str(value))} is outside {low}..{high}", "params.range")
    return value


def _number(value: Any, field: str, low: float, high: float) -> float:
    if type(value) not in (int, float) or not math.isfinite(value):
        raise invalid_params(field, f"expected a finite number, got {_type(value)}")
    if not low <= value <= high:
        raise invalid_params(field, f"{value} is outside [{low}, {high}]", "params.range")
    return float(value)


def _boolean(value: Any, field: str) -> bool:
    if type(value) is not bool:
        raise invalid_params(field, f"expected true or false, got {_type(value)}")
    return value


def _cid(value: Any, field: str) -> CID:
    text = _text(value, field, limit=ECHO_CHARS)  # a CID is 59 characters; a longer one is refused unquoted
    try:
        return CID.parse(text, field=field)
    except CIDError as exc:
        raise invalid_params(field, exc.message.removeprefix(f"{field}: "), exc.code) from None


def _cids(value: Any, field: str, most: int) -> list[CID]:
    if not isinstance(value, list) or not 1 <= len(value) <= most:
        raise invalid_params(field, f"expected a list of 1 to {most} CIDs, got {_type(value)}")
    return [_cid(item, f"{field}[{index}]") for index, item in enumerate(value)]


def _type(value: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}.get(
        type(value), "number"
    )


def _optional(value: Any, check: Any, *args: Any) -> Any:
    return None if value is None else check(value, *args)


# --- answers ----------------------------------------------------------------------------------------


def receipt_json(receipt: Receipt) -> dict[str, Any]:
    return {
        "cid": str(receipt.cid) if receipt.cid else None,
        "kind": receipt.kind.value if receipt.kind else None,
        "verdict": receipt.verdict.value,
        "outcome": receipt.outcome,
        "code": receipt.code,
        "status": receipt.status.to_json() if receipt.status else None,
        "errors": [{"code": error.code, "message": error.message} for error in receipt.errors],
    }


def hit_json(hit: Hit) -> dict[str, Any]:
    return {
        "id": str(hit.id),
        "text": hit.text,
        "domain": hit.domain,
        "score": round(hit.score, 6),
        "confidence": hit.confidence,
        "votes": {"upvotes": hit.upvotes, "downvotes": hit.downvotes},
        "conflicted": hit.conflicted,
        "ranked_by": hit.ranked_by,
    }


def _experience_view(view: LedgerView, record: ExperienceRecord, embedding: bool, usage: Usage) -> dict[str, Any]:
    block = view.block(record.version)
    assert block is not None
    proof = view.inclusion_proof(record.version)
    shown = experience_json(
        record.id,
        block.op,
        upvotes=record.up,
        downvotes=record.down,
        usage_count=usage.count,
        domains_applied=tuple(usage.domains_applied),
        merkle_proof=proof,
    )
    if not embedding:
        shown["embedding"]["values"] = (
            f"{len(shown['embedding']['values'])} float16 values (embedding: true shows them)"
        )
    return {**shown, "library": record.to_json()}


def _history(view: LedgerView, exp_id: CID) -> list[dict[str, Any]]:
    """Every operation on an experience and on those it absorbed, in fold order (clock, CID)."""
    family, queue = set(), [exp_id]
    while queue:
        current = queue.pop()
        if current in family:
            continue
        family.add(current)
        record = view.experience(current)
        if record is not None:
            queue.extend(record.absorbed)
    operations = set(family)
    for member in family:
        operations.update(view.by_target(member))
    entries = []
    for cid in operations:
        block, status = view.block(cid), view.status(cid)
        if block is None or status is None:
            continue
        op = block.op
        entry: dict[str, Any] = {"cid": str(cid), "kind": op.kind.value, "author": op.author, "clock": op.clock}
        if op.content is not None:
            entry["text"] = op.content.text
        if op.vote is not None:
            entry["vote"] = op.vote
        if op.reason is not None:
            entry["reason"] = op.reason
        entries.append(((op.clock, cid.raw), {**entry, "status": status.to_json()}))
    return [entry for _, entry in sorted(entries, key=lambda item: item[0])]


def _content_json(content: Experience) -> dict[str, Any]:
    """An experience's user fields, as the JSON view takes them (a modify starts from the visible version)."""
    return {
        "text": content.text,
        "domain": ".".join(content.domain),
        "confidence": content.confidence,
        "examples": [{"input": ex.input, "output": ex.output, "correct": ex.correct} for ex in content.examples],
        "metadata": {"source": content.source},
    }


# --- the methods --------------------------------------------------------------------------------------


async def record_usage(node: Node, usage: UsageStats, hits: list[Hit], how: str, domain: str | None) -> None:
    """Count a serve; if the counts cannot be written (a full disk), the serve goes on: they are not the ledger."""
    try:
        await node.read(usage.record, [(hit.id, hit.domain) for hit in hits], how, domain)
    except UsageError as exc:
        log.warning("%s: %s", exc.code, exc.message)


def register(
    rpc: Dispatcher, node: Node, stop: trio.Event, network: P2PNode | None = None, usage: UsageStats | None = None
) -> None:
    """Register every method of docs/RPC.md on `rpc`; `network` is None for a node without p2p, `usage` None for
    a node that does not count serves (node/usage.py)."""
    ledger, params = node.ledger, node.ledger.params

    def usage_of(exp_id: CID) -> Usage:
        return usage.of(exp_id) if usage is not None else Usage()

    async def served(hits: list[Hit], how: str, domain: str | None) -> None:
        """Count a serve (synced to disk before the answer goes out: a count a client saw survives kill -9)."""
        if usage is not None and hits:
            await record_usage(node, usage, hits, how, domain)

    async def submit_block(data: bytes) -> dict[str, Any]:
        try:
            receipt = await node.submit(Submission(data, Source("rpc")))
        except Busy as exc:
            raise RpcError(BUSY, str(exc), {"code": "ingest.busy"}) from None
        except Stopping as exc:
            raise RpcError(STOPPING, str(exc), {"code": "node.stopping"}) from None
        except IngestFailed as exc:
            if exc.code == STORE_UNWRITABLE:
                store = await node.read(ledger.writability)
                data = {"code": exc.code, "free_bytes": store.free_bytes, "min_free_bytes": store.min_free_bytes}
                raise RpcError(UNWRITABLE, str(exc), data) from None
            raise RpcError(INTERNAL_ERROR, str(exc), {"code": exc.code}) from None
        if receipt.verdict is Verdict.REJECTED:
            first = receipt.errors[0]
            raise RpcError(
                REJECTED,
                f"operation rejected: {first.message}",
                {"code": first.code, **receipt_json(receipt)},
            )
        return receipt_json(receipt)

    def content(fields: dict[str, Any]) -> Experience:
        try:
            return experience_from_json(fields, ledger.embedder)
        except JsonViewError as exc:
            field = exc.message.split(":", 1)[0]
            raise RpcError(INVALID_PARAMS, exc.message, {"code": exc.code, "field": field}) from None

    def experience_fields(
        text: Any, domain: Any, confidence: Any, examples: Any, source: Any, base: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        fields = dict(base or {})
        for name, value in (("text", text), ("domain", domain), ("confidence", confidence), ("examples", examples)):
            if value is not None:
                fields[name] = value
        if source is not None:
            fields["metadata"] = {"source": source}
        return fields

    def existing(view: LedgerView, exp_id: CID, field: str) -> ExperienceRecord:
        record = view.experience(exp_id)
        if record is None:
            raise RpcError(NOT_FOUND, f"{field}: no experience {exp_id} here", {"code": "not_found.experience"})
        return record

    async def make(kind: Kind, targets: list[CID], **fields: Any) -> dict[str, Any]:
        def build() -> Block:
            view = ledger.view()
            for index, target in enumerate(targets):
                existing(view, target, "target" if kind is not Kind.MERGE else f"targets[{index}]")
            if kind is Kind.MERGE:
                fields["targets"] = tuple(sorted(set(targets)))
            elif targets:
                fields["target"] = targets[0]
            if "content" in fields:
                fields["content"] = content(fields["content"])
            return node.build(kind, targets, **fields)

        return await submit_block((await node.read(build)).data)

    @rpc.method("submit")
    async def submit(operation: Any, encoding: Any = "hex") -> dict[str, Any]:
        text = _text(operation, "operation", limit=4 * params.max_op_bytes)
        try:
            if encoding == "hex":
                data = bytes.fromhex(text)
            elif encoding == "base64":
                data = base64.b64decode(text, validate=True)
            else:
                raise invalid_params("encoding", f"{clip(repr(encoding))} is not 'hex' or 'base64'", "params.range")
        except (ValueError, binascii.Error):
            raise invalid_params("operation", f"not valid {encoding}", "params.encoding") from None
        return await submit_block(data)

    @rpc.method("add")
    async def add(text: Any, domain: Any, confidence: Any, examples: Any = None, source: Any = None) -> dict[str, Any]:
        return await make(Kind.ADD, [], content=experience_fields(text, domain, confidence, examples, source))

    @rpc.method("modify")
    async def modify(
        target: Any,
        text: Any = None,
        domain: Any = None,
        confidence: Any = None,
        examples: Any = None,
        source: Any = None,
    ) -> dict[str, Any]:
        exp_id = _cid(target, "target")

        def base() -> dict[str, Any]:
            view = ledger.view()
            return _content_json(view.content(existing(view, exp_id, "target").version))

        fields = experience_fields(text, domain, confidence, examples, source, await node.read(base))
        return await make(Kind.MODIFY, [exp_id], content=fields)

    @rpc.method("delete")
    async def delete(target: Any, reason: Any) -> dict[str, Any]:
        exp_id = _cid(target, "target")
        return await make(Kind.DELETE, [exp_id], reason=_text(reason, "reason", limit=params.max_reason_chars))

    @rpc.method("merge")
    async def merge(
        targets: Any,
        text: Any,
        domain: Any,
        confidence: Any,
        reason: Any,
        examples: Any = None,
        source: Any = None,
    ) -> dict[str, Any]:
        sources = _cids(targets, "targets", params.max_merge_targets)
        if len(set(sources)) < 2:
            raise invalid_params("targets", "a merge needs at least 2 different experiences", "params.range")
        return await make(
            Kind.MERGE,
            sources,
            content=experience_fields(text, domain, confidence, examples, source),
            reason=_text(reason, "reason", limit=params.max_reason_chars),
        )

    @rpc.method("vote")
    async def vote(target: Any, value: Any) -> dict[str, Any]:
        exp_id = _cid(target, "target")
        votes = {1: 1, -1: -1, "+1": 1, "-1": -1, "up": 1, "down": -1}
        if isinstance(value, bool) or value not in votes:
            raise invalid_params("value", "expected +1, -1, 'up' or 'down'", "params.range")
        return await make(Kind.VOTE, [exp_id], vote=votes[value])

    @rpc.method("get")
    async def get(id: Any, embedding: Any = False) -> dict[str, Any]:
        exp_id, full = _cid(id, "id"), _boolean(embedding, "embedding")

        def read() -> dict[str, Any]:
            view = ledger.view()
            return _experience_view(view, existing(view, exp_id, "id"), full, usage_of(exp_id))

        return await node.read(read)

    @rpc.method("list")
    async def list_(
        domain: Any = None,
        author: Any = None,
        status: Any = None,
        conflicted: Any = None,
        cursor: Any = None,
        limit: Any = 100,
    ) -> dict[str, Any]:
        domain = _optional(domain, _text, "domain", 300)
        author = _optional(author, _text, "author", 100)
        if status is not None and status not in {life.value for life in Life}:
            raise invalid_params("status", "expected 'live', 'deleted' or 'alias'", "params.range")
        conflicted = _optional(conflicted, _boolean, "conflicted")
        after = _optional(cursor, _cid, "cursor")
        count = _integer(limit, "limit", 1, MAX_LIST)

        def read() -> dict[str, Any]:
            found: list[dict[str, Any]] = []
            more = False
            for record in ledger.view().experiences(after):
                if after is not None and record.id == after:
                    continue
                if (
                    (domain and not (record.domain == domain or record.domain.startswith(domain + ".")))
                    or (author and record.created_by != author)
                    or (status and record.status.value != status)
                    or (conflicted is not None and record.conflicted != conflicted)
                ):
                    continue
                if len(found) == count:
                    more = True
                    break
                counted = usage_of(record.id)
                found.append(
                    {**record.to_json(), "usage_count": counted.count, "domains_applied": counted.domains_applied}
                )
            return {"experiences": found, "next_cursor": found[-1]["id"] if more else None}

        return await node.read(read)

    @rpc.method("history")
    async def history(id: Any) -> dict[str, Any]:
        exp_id = _cid(id, "id")

        def read() -> dict[str, Any]:
            view = ledger.view()
            existing(view, exp_id, "id")
            return {"id": str(exp_id), "operations": _history(view, exp_id)}

        return await node.read(read)

    def retrieval_args(query: Any, k: Any, threshold: Any, domain: Any) -> tuple[str, int, float | None, str | None]:
        return (
            _text(query, "query"),
            _integer(k, "k", 0, 100),
            _optional(threshold, _number, "threshold", -1.0, 1.0),
            _optional(domain, _text, "domain", 300),
        )

    @rpc.method("retrieve")
    async def retrieve(query: Any, k: Any = DEFAULT_K, threshold: Any = None, domain: Any = None) -> dict[str, Any]:
        args = retrieval_args(query, k, threshold, domain)
        started = time.perf_counter()
        hits = await node.read(node.retriever.retrieve, *args)
        node.metrics.retrieval_seconds.observe(time.perf_counter() - started)
        await served(hits, "retrieve", args[3])
        return {"hits": [hit_json(hit) for hit in hits]}

    @rpc.method("context")
    async def context(
        query: Any, k: Any = DEFAULT_K, threshold: Any = None, budget: Any = DEFAULT_BUDGET, domain: Any = None
    ) -> dict[str, Any]:
        question, count, floor, prefix = retrieval_args(query, k, threshold, domain)
        tokens = _integer(budget, "budget", 16, 1 << 20)
        prompt, hits = await node.read(node.retriever.injection, question, count, floor, tokens, prefix)
        await served(hits, "context", prefix)
        return {"prompt": prompt}

    @rpc.method("usage")
    async def usage_method(id: Any = None, limit: Any = 20) -> dict[str, Any]:
        exp_id = _optional(id, _cid, "id")
        count = _integer(limit, "limit", 1, MAX_TOP)

        def read() -> dict[str, Any]:
            view = ledger.view()
            if exp_id is not None:
                ranked = [(exp_id, usage_of(existing(view, exp_id, "id").id))]
            else:
                ranked = usage.top(count) if usage is not None else []
            found = []
            for served_id, counted in ranked:
                record = view.experience(served_id)
                shown: dict[str, Any] = {"id": str(served_id), "status": None, "domain": None, "text": None}
                if record is not None:  # a count outlives the ledger's data if that was reset
                    shown |= {"status": record.status.value, "domain": record.domain}
                    shown["text"] = view.content(record.version).text
                found.append({**shown, **counted.to_json()})
            return {"experiences": found, "tracked": len(usage) if usage is not None else 0}

        return await node.read(read)

    @rpc.method("coverage")
    async def coverage(queries: Any, tau: Any = None) -> dict[str, Any]:
        if not isinstance(queries, list) or not 1 <= len(queries) <= MAX_QUERIES:
            raise invalid_params("queries", f"expected a list of 1 to {MAX_QUERIES} strings")
        texts = [_text(query, f"queries[{index}]") for index, query in enumerate(queries)]
        floor = _optional(tau, _number, "tau", -1.0, 1.0)
        share = await node.read(node.retriever.coverage, texts, floor)
        return {"coverage": share, "queries": len(texts)}

    @rpc.method("head")
    async def head() -> dict[str, Any]:
        return await node.read(lambda: ledger.view().tree_head().to_json())

    def proof_error(exc: ProofError) -> RpcError:
        return RpcError(NOT_FOUND, exc.message, {"code": exc.code})

    @rpc.method("proof.inclusion")
    async def proof_inclusion(cid: Any, size: Any = None) -> dict[str, Any]:
        operation, tree_size = _cid(cid, "cid"), _optional(size, _integer, "size", 1, 2**63)

        def read() -> dict[str, Any]:
            try:
                return ledger.view().inclusion_proof(operation, tree_size)
            except ProofError as exc:
                raise proof_error(exc) from None

        return await node.read(read)

    @rpc.method("proof.consistency")
    async def proof_consistency(old_size: Any, new_size: Any = None) -> dict[str, Any]:
        old, new = _integer(old_size, "old_size", 1, 2**63), _optional(new_size, _integer, "new_size", 1, 2**63)

        def read() -> dict[str, Any]:
            try:
                return ledger.view().consistency_proof(old, new)
            except ProofError as exc:
                raise proof_error(exc) from None

        return await node.read(read)

    @rpc.method("state_root")
    async def state_root() -> dict[str, Any]:
        def read() -> dict[str, Any]:
            view = ledger.view()
            return {"state_root": view.state_root().hex(), "log_size": view.log_size}

        return await node.read(read)

    auditing = trio.Lock()

    @rpc.method("audit")
    async def audit() -> dict[str, Any]:
        """Fold the log again with the reference fold and compare it with the library, on a reader thread: one at a
        time (it holds every operation in memory), on the state committed when it starts."""
        if auditing.locked():
            raise RpcError(BUSY, "an audit is running; retry when it ends", {"code": "audit.busy"})
        async with auditing:
            progress = every(AUDIT_PROGRESS_SECONDS, log.info)
            result = await node.read(lambda: audit_view(ledger.view(), params, progress))
        log.info("audit: %s", result.line())
        return result.to_json()

    def retrieval_status() -> dict[str, Any]:
        local = node.retriever.local
        if local is None:
            live = ledger.live_count()
            return {"model": NETWORK, "threshold": params.relevance_threshold, "live": live, "missing": 0}
        return local.progress(catch_up=INLINE_EMBED)

    @rpc.method("status")
    async def status() -> dict[str, Any]:
        def read() -> dict[str, Any]:
            view = ledger.view()
            pending, missing = view.pending(), sorted(view.missing())
            live = ledger.live_count()  # the index holds exactly the live experiences; copying its map to count
            # them held the index lock (and every search) ~12 ms at 200k
            return {
                "version": VERSION,
                "network_id": params.network_id,
                "node": ledger.node_key.did,
                "author": node.author.did,
                "log_size": view.log_size,
                "state_root": view.state_root().hex(),
                "pending": len(pending),
                "waiting_for": [str(cid) for cid in missing[:100]],
                "live_experiences": live,
                "index": {"status": ledger.index_status, "indexed": live},
                "retrieval": retrieval_status(),
                "ingest_queue": node.queued(),
                "store": ledger.writability().to_json(),
                "uptime_seconds": round(time.time() - node.started, 3),
            }

        answer = await node.read(read)
        answer["p2p"] = None
        if network is not None:
            answer["p2p"] = {"peer_id": str(network.id), "addrs": network.addrs, "sync": network.sync_status()}
        return answer

    if network is not None:
        register_network(rpc, network)

    @rpc.method("stop")
    async def stop_node() -> dict[str, Any]:
        stop.set()
        return {"stopping": True}

    node.metrics.set_known_methods(rpc.method_names)


def register_network(rpc: Dispatcher, network: P2PNode) -> None:
    """The peer methods (Kubo's `swarm peers/connect/disconnect`)."""

    @rpc.method("peers")
    async def peers() -> dict[str, Any]:
        return {"self": network.describe(), "peers": network.records()}

    @rpc.method("peers.connect")
    async def peers_connect(addr: Any) -> dict[str, Any]:
        from p2p.host import parse_peer_addr  # libp2p loads only in a daemon with a network

        text = _text(addr, "addr", 1000)
        try:
            parse_peer_addr(text)
        except LedgerError as exc:
            log.info("peers.connect: %s", exc.message)
            raise invalid_params("addr", f"{clip(text)} is not a multiaddr ending in /p2p/PEERID", exc.code) from None
        try:
            peer_id = await network.connect(text)
        except LedgerError as exc:  # this node itself: p2p.self_dial
            raise invalid_params("addr", exc.message.removeprefix("addr: "), exc.code) from None
        except trio.TooSlowError:
            message = f"{clip(text)}: no answer within the dial timeout"
            raise RpcError(UNAVAILABLE, message, {"code": "p2p.dial"}) from None
        except Exception as exc:  # libp2p raises many types for a failed dial
            log.info("peers.connect: dialling %s failed: %r", text, exc)
            message = f"{clip(text)}: cannot connect (the node's log says why)"
            raise RpcError(UNAVAILABLE, message, {"code": "p2p.dial"}) from None
        return {"peer_id": str(peer_id), "connected": True}

    @rpc.method("peers.disconnect")
    async def peers_disconnect(peer_id: Any) -> dict[str, Any]:
        text = _text(peer_id, "peer_id", 100)
        match = next((p for p in network.peers.values() if str(p.id) == text), None)
        if match is None or not network.is_connected(match.id):
            raise RpcError(NOT_FOUND, f"peer_id: not connected to {text}", {"code": "p2p.unknown_peer"})
        await network.disconnect(match.id)
        return {"peer_id": text, "connected": False}
