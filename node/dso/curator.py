"""The curator: a daemon configured with an LLM (`[llm] curate = true`) tends the library.

- Conflicts (the DSO seed's "Modify + Modify: merge into a single Modify via LLM synthesis"): for each
  live experience with concurrent heads, the model writes one text reconciling the versions, published
  as a modify whose parents include every head, which resolves the conflict on every node.
- Paraphrases the exact near-duplicate rule does not merge: live experiences at least
  `curate_similarity` apart (cosine) are shown to the model, asked whether they state the same
  strategy; a yes with a valid merged text is published as a merge.

Why inside the daemon rather than an RPC client: curation scans the whole library (every conflicted
record, every experience's nearest neighbours in the vector index) and builds on the node's own heads;
here that is a read of a view on a reader thread, not pages of RPC calls, and the operations are
signed by the node's author key like every operation the node makes. The model is called with the
synchronous client on a worker thread (trio.to_thread), so the event loop never waits for it.

Rate-limited (`curate_calls_per_minute`), idempotent (a conflict, keyed by its experience and heads,
and a pair of experiences are each decided once by this node), and every decision is logged. When
several curators race on one conflict, only the one whose author DID sorts first resolves a conflict
that already holds another curator's resolution, so they do not chase each other.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from functools import partial
from typing import Any

import trio

from ledger.cid import CID
from ledger.embedder import unit, unpack_float16
from ledger.errors import LedgerError
from ledger.ingest import Source, Submission, Verdict
from ledger.jsonview import experience_from_json
from ledger.ops import Block, Kind
from ledger.validation import check_embeddings, check_text, examine
from node.config import LlmConfig
from node.dso.llm import LlmClient, LlmError, LlmOutputError, LlmSettings
from node.dso.parsing import Rejected, json_value
from node.dso.prompts import EXPERIENCE_SCHEMA
from node.service import Busy, IngestFailed, Node, Stopping

log = logging.getLogger("expledger.curator")

SOURCE = "curator"
NEIGHBOURS = 4  # nearest experiences examined per experience for paraphrases
MAX_ATTEMPTS = 3  # model answers tried per conflict or pair before it is left alone

RECONCILE_PROMPT = """Several agents refined the same experience concurrently; these versions now conflict:

{versions}

Write ONE experience that reconciles them: keep what each version gets right, drop what they
contradict without support.

REQUIREMENTS:
1. Begin with context ("When...", "For...")
2. Focus on strategic patterns, not calculations
3. Max 32 words
4. Must be generalizable (no problem-specific constants)

Return JSON: {{"experience": "When... then..."}}"""

SAME_PROMPT = """Do these two experiences state the same strategy (one could replace the other without losing
any guidance)?

A: {first}
B: {second}

If they do, also write one experience that states it best (begin with "When..." or "For...",
max 32 words, no problem-specific constants).

Return JSON: {{"same": true or false, "experience": "When... (only if same)", "reason": "why"}}"""

_RECONCILE_SCHEMA = {"type": "object", "properties": {"experience": EXPERIENCE_SCHEMA}, "required": ["experience"]}
_SAME_SCHEMA = {
    "type": "object",
    "properties": {
        "same": {"type": "boolean"},
        "experience": EXPERIENCE_SCHEMA,
        "reason": {"type": "string", "maxLength": 300},
    },
    "required": ["same"],
}


@dataclass(frozen=True, slots=True)
class Conflict:
    exp_id: CID
    heads: tuple[CID, ...]
    texts: tuple[str, ...]
    domain: str
    confidence: float
    #: the authors of the heads that are curator resolutions
    curators: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Pair:
    first: CID
    second: CID
    texts: tuple[str, str]
    domain: str
    confidence: float
    cosine: float


class Curator:
    """One daemon's curation passes; `run` loops until cancelled."""

    def __init__(self, node: Node, config: LlmConfig, llm: LlmClient | None = None) -> None:
        self.node = node
        self.config = config
        self.llm = llm
        self._gap = 60.0 / config.curate_calls_per_minute
        self._next_call = 0.0
        self._decided: set[Any] = set()  # conflicts (id, heads) and pairs (a, b) this node has settled
        self._attempts: dict[Any, int] = {}
        self._examined: set[CID] = set()  # experience versions whose neighbours were examined

    async def run(self) -> None:
        if self.llm is None:
            settings = LlmSettings.resolve(self.config)
            self.llm = await trio.to_thread.run_sync(LlmClient, settings)
        log.info(
            "curator: on, model endpoint %s, a pass every %d s", self.llm.settings.base_url, self.config.curate_interval
        )
        passes = 0
        while True:
            passes += 1
            try:
                done = await self.curate()
                log.debug("curator: pass %d: %d resolved, %d merged", passes, done["resolved"], done["merged"])
            except LlmError as exc:
                log.error(
                    "curator: the model failed (%s: %s); next pass in %d s",
                    exc.code,
                    exc.message,
                    self.config.curate_interval,
                )
            except Exception:  # a bug in one pass must not end the node: logged, and the next pass tries again
                log.exception("curator: the pass failed")
            await trio.sleep(self.config.curate_interval)

    async def curate(self) -> dict[str, int]:
        """One pass: every conflict, then paraphrase candidates; counts what was published."""
        done = {"resolved": 0, "merged": 0}
        for conflict in await self.node.read(self._conflicts):
            if await self._resolve(conflict):
                done["resolved"] += 1
        for pair in await self.node.read(self._pairs):
            if await self._merge(pair):
                done["merged"] += 1
        return done

    # --- reading the library (reader threads) --------------------------------------------------------

    def _conflicts(self) -> list[Conflict]:
        view = self.node.view()
        found = []
        for record in view.experiences():
            if not record.live or not record.conflicted:
                continue
            blocks = [view.block(head) for head in record.heads]
            contents = [block.op.content for block in blocks if block is not None and block.op.content is not None]
            if len(contents) != len(record.heads):
                continue
            curators = tuple(
                block.op.author for block in blocks if block is not None and block.op.content.source.startswith(SOURCE)
            )
            found.append(
                Conflict(
                    record.id,
                    tuple(record.heads),
                    tuple(content.text for content in contents),
                    record.domain,
                    max(content.confidence for content in contents),
                    curators,
                )
            )
        return found

    def _pairs(self) -> list[Pair]:
        """Live, unconflicted experiences whose versions lie at least `curate_similarity` apart, each pair once."""
        view, ledger = self.node.view(), self.node.ledger
        found: dict[tuple[bytes, bytes], Pair] = {}
        for record in view.experiences():
            if not record.live or record.conflicted or record.version in self._examined:
                continue
            content = view.content(record.version)
            pending = False
            vector = unit(unpack_float16(content.embedding.values))
            for other_id, cosine in ledger.nearest(vector, NEIGHBOURS + 1):
                if other_id == record.id or cosine < self.config.curate_similarity:
                    continue
                other = view.experience(other_id)
                if other is None or not other.live or other.conflicted:
                    continue
                first, second = sorted((record.id, other_id), key=lambda cid: cid.raw)
                if (first, second) in self._decided or self._attempts.get((first, second), 0) >= MAX_ATTEMPTS:
                    continue
                pending = True
                texts = (
                    (content.text, view.content(other.version).text)
                    if first == record.id
                    else (view.content(other.version).text, content.text)
                )
                other_confidence = view.content(other.version).confidence
                found[(first.raw, second.raw)] = Pair(
                    first, second, texts, record.domain, max(content.confidence, other_confidence), cosine
                )
            if not pending:  # examined again only while one of its candidate pairs awaits a decision
                self._examined.add(record.version)
        return list(found.values())

    # --- decisions ------------------------------------------------------------------------------------------

    async def _resolve(self, conflict: Conflict) -> bool:
        key = (conflict.exp_id, conflict.heads)
        if key in self._decided or self._attempts.get(key, 0) >= MAX_ATTEMPTS:
            return False
        mine = self.node.author.did
        rival = min((author for author in conflict.curators if author != mine), default=None)
        if rival is not None and rival < mine:
            log.info(
                "curator: conflict on %s: left to the curator %s (its resolution is a head)", conflict.exp_id, rival
            )
            self._decided.add(key)
            return False
        versions = "\n".join(f"Version {index}: {text}" for index, text in enumerate(conflict.texts, 1))
        text = await self._ask(key, RECONCILE_PROMPT.format(versions=versions), _RECONCILE_SCHEMA, "reconcile")
        if text is None:
            return False
        fields = {"text": text, "domain": conflict.domain, "confidence": conflict.confidence}
        cid = await self._publish(key, Kind.MODIFY, [conflict.exp_id], fields, target=conflict.exp_id)
        if cid is not None:
            log.info(
                "curator: conflict on %s (heads %s) resolved by modify %s: %r",
                conflict.exp_id,
                ", ".join(map(str, conflict.heads)),
                cid,
                text,
            )
        return cid is not None

    async def _merge(self, pair: Pair) -> bool:
        key = (pair.first, pair.second)
        if self._attempts.get(key, 0) >= MAX_ATTEMPTS:
            return False
        prompt = SAME_PROMPT.format(first=pair.texts[0], second=pair.texts[1])
        answer = await self._call(key, prompt, _SAME_SCHEMA, "same-strategy")
        if answer is None:
            return False
        if answer.get("same") is not True:
            log.info(
                "curator: %s and %s (cosine %.3f): not the same strategy, kept apart",
                pair.first,
                pair.second,
                pair.cosine,
            )
            self._decided.add(key)
            return False
        text = self._valid_text(key, answer, "same-strategy")
        if text is None:
            return False
        reason = answer.get("reason") if isinstance(answer.get("reason"), str) and answer["reason"].strip() else ""
        reason = (reason or "the curator's model: the same strategy")[: self.node.params.max_reason_chars]
        fields = {"text": text, "domain": pair.domain, "confidence": pair.confidence}
        cid = await self._publish(key, Kind.MERGE, [pair.first, pair.second], fields, targets=key, reason=reason)
        if cid is not None:
            log.info(
                "curator: %s and %s (cosine %.3f) merged into %s: %r", pair.first, pair.second, pair.cosine, cid, text
            )
        return cid is not None

    async def _ask(self, key: Any, prompt: str, schema: dict[str, Any], purpose: str) -> str | None:
        answer = await self._call(key, prompt, schema, purpose)
        return None if answer is None else self._valid_text(key, answer, purpose)

    async def _call(self, key: Any, prompt: str, schema: dict[str, Any], purpose: str) -> dict[str, Any] | None:
        """The model's JSON object for a prompt, after waiting for the rate limit; None (logged) if unusable."""
        assert self.llm is not None
        now = time.monotonic()
        if self._next_call > now:
            await trio.sleep(self._next_call - now)
        self._next_call = max(now, self._next_call) + self._gap
        self._attempts[key] = self._attempts.get(key, 0) + 1
        complete = partial(
            self.llm.complete, [{"role": "user", "content": prompt}], purpose=purpose, max_tokens=256, schema=schema
        )
        try:
            try:
                answer = await trio.to_thread.run_sync(complete, abandon_on_cancel=True)
            except LlmOutputError as exc:  # this answer failed, not the endpoint: the pass goes on
                raise Rejected(exc.code, exc.message) from None
            value = json_value(answer.text)
            if not isinstance(value, dict):
                raise Rejected("parse.shape", "expected a JSON object")
        except Rejected as rejected:
            log.warning(
                "curator: %s for %s: answer rejected (%s): %s", purpose, _name(key), rejected.code, rejected.detail
            )
            return None
        return value

    def _valid_text(self, key: Any, answer: dict[str, Any], purpose: str) -> str | None:
        text = answer.get("experience")
        if not isinstance(text, str) or not text.strip():
            log.warning("curator: %s for %s: answer rejected (op.missing_text)", purpose, _name(key))
            return None
        text = " ".join(text.split())
        errors = check_text(text, self.node.params, "experience")
        if errors:
            log.warning(
                "curator: %s for %s: answer rejected (%s): %s", purpose, _name(key), errors[0].code, errors[0].message
            )
            return None
        return text

    async def _publish(self, key: Any, kind: Kind, on: list[CID], fields: dict[str, Any], **extra: Any) -> CID | None:
        """Build (on the node's heads, signed by its author), validate and submit; the CID once durable."""
        assert self.llm is not None
        source = f"{SOURCE} model={self.llm.model}"[: self.node.params.max_source_chars]
        ledger = self.node.ledger

        def build() -> Block:
            content = experience_from_json({**fields, "metadata": {"source": source}}, ledger.embedder)
            block = self.node.build(kind, on, content=content, **extra)
            _, errors = examine(block.data, self.node.params)
            inconsistent = check_embeddings([block], ledger.embedder, self.node.params).get(block.cid.raw)
            if errors or inconsistent:
                first = errors[0] if errors else inconsistent
                raise Rejected(first.code, first.message)
            return block

        try:
            block = await self.node.read(build)
            receipt = await self.node.submit(Submission(block.data, Source(SOURCE)))
        except (Rejected, LedgerError) as exc:
            log.warning("curator: %s for %s refused: %s", kind, _name(key), exc)
            return None
        except (Busy, IngestFailed, Stopping) as exc:
            log.warning("curator: %s for %s not stored (%s); tried again next pass", kind, _name(key), exc)
            return None
        if receipt.verdict is Verdict.REJECTED:
            log.warning("curator: %s for %s rejected by the ledger: %s", kind, _name(key), receipt.errors[0].message)
            return None
        self._decided.add(key)
        return receipt.cid


def _name(key: Any) -> str:
    return " / ".join(str(part) if isinstance(part, CID) else ",".join(map(str, part)) for part in key)


async def run_until(node: Node, config: LlmConfig, stop: trio.Event) -> None:
    """The curator of a daemon, from start until the node begins to stop."""
    async with trio.open_nursery() as nursery:
        nursery.start_soon(Curator(node, config).run)
        await stop.wait()
        nursery.cancel_scope.cancel()
