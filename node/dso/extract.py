"""Semantic advantage extraction (the DSO seed's algorithm): rollouts in, signed operations out.

Stage 1 summarizes each rollout with the experiences that were in its context; stage 2 critiques
each group, and only groups with mixed outcomes carry a learning signal (as in Training-Free
GRPO: the others are skipped and counted); stage 3 consolidates every group's suggestions against
the experiences the groups were shown. Experiences appear in prompts under short ids mapped back
to CIDs. Each proposal that survives the checks becomes an operation signed by the author key,
built on what the node holds (so it takes effect), and checked with the ledger's own validation,
embedding consistency included, before it is submitted or written out.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import re
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ledger.cid import CID, CIDError
from ledger.embedder import Embedder
from ledger.errors import LedgerError
from ledger.jsonview import experience_from_json
from ledger.keys import AuthorKey
from ledger.ops import Block, Kind, Operation, sign
from ledger.params import NetworkParams
from ledger.validation import check_embeddings, examine
from node.client import RpcFailed
from node.dso import prompts
from node.dso.llm import Completion, LlmClient, LlmOutputError
from node.dso.nodelink import Entry, NodeLink
from node.dso.parsing import Proposal, Rejected, ShortIds, check_proposal, operation_items

log = logging.getLogger("expledger.dso")

MAX_OPS_PER_GROUP = 3  # the prompt-templates seed's "Max 3 operations per group"
CRITIQUE_OPTIONS = ("add", "modify", "delete")
CONSOLIDATE_OPTIONS = ("add", "modify", "merge", "delete")
DEFAULT_K = 5  # the hyperparameter table's top-k
MAX_ROLLOUT_FILE_BYTES = 64 << 20
MAX_TEXT_CHARS = 100_000  # a problem, answer or trajectory longer than this is refused, not truncated
EXAMPLE_CHARS = 500
DEFAULT_DELETE_REASON = "DSO: found incorrect in evaluation"
_GROUP_MENTION = re.compile(r"\bgroup\s*#?\s*(\d+)", re.I)


class RolloutsError(LedgerError):
    """A rollouts or problems file that cannot be used; the message names the line and the field."""


@dataclass(frozen=True, slots=True)
class Rollout:
    trajectory: str
    correct: bool
    reward: float | None = None
    #: the experiences that were in the rollout's context (CIDs)
    experiences: tuple[CID, ...] = ()


@dataclass(frozen=True, slots=True)
class Group:
    """One problem, its ground truth and its G rollouts."""

    problem: str
    answer: str
    domain: str
    rollouts: tuple[Rollout, ...]

    @property
    def correct(self) -> int:
        return sum(rollout.correct for rollout in self.rollouts)

    @property
    def mixed(self) -> bool:
        """Only a group with both outcomes has an advantage to learn from."""
        return 0 < self.correct < len(self.rollouts)

    @property
    def problem_hash(self) -> str:
        return hashlib.sha256(self.problem.encode()).hexdigest()[:12]

    @property
    def signal(self) -> float:
        """The spread of the group's rewards in [0, 1] (twice the standard deviation of pass/fail): the
        format seed's confidence "derived from advantage magnitude"."""
        share = self.correct / len(self.rollouts)
        return round(2 * math.sqrt(share * (1 - share)), 2)


@dataclass
class Report:
    """What one extraction did: groups, proposals, operations and every rejection by reason."""

    groups: int = 0
    skipped_uniform: int = 0
    suggested: int = 0
    proposed: int = 0
    operations: Counter[str] = field(default_factory=Counter)
    outcomes: Counter[str] = field(default_factory=Counter)
    rejections: Counter[str] = field(default_factory=Counter)
    #: the same rejections by where they happened: "critique" and "consolidate" (one proposal each),
    #: "critique answer" and "consolidate answer" (a whole answer), "build" (a proposal the ledger refused)
    rejected_at: Counter[str] = field(default_factory=Counter)
    cids: list[str] = field(default_factory=list)

    def reject(self, stage: str, where: str, rejected: Rejected) -> None:
        self.rejections[rejected.code] += 1
        self.rejected_at[stage] += 1
        log.warning("dso: %s %s: rejected (%s): %s", stage, where, rejected.code, rejected.detail)

    def add(self, other: Report) -> None:
        self.groups += other.groups
        self.skipped_uniform += other.skipped_uniform
        self.suggested += other.suggested
        self.proposed += other.proposed
        self.operations.update(other.operations)
        self.outcomes.update(other.outcomes)
        self.rejections.update(other.rejections)
        self.rejected_at.update(other.rejected_at)
        self.cids.extend(other.cids)

    def to_json(self) -> dict[str, Any]:
        return {
            "groups": self.groups,
            "skipped_uniform": self.skipped_uniform,
            "suggested": self.suggested,
            "proposed": self.proposed,
            "operations": dict(sorted(self.operations.items())),
            "outcomes": dict(sorted(self.outcomes.items())),
            "rejections": dict(sorted(self.rejections.items())),
            "rejected_at": dict(sorted(self.rejected_at.items())),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Report:
        return cls(
            data["groups"],
            data["skipped_uniform"],
            data["suggested"],
            data["proposed"],
            Counter(data["operations"]),
            Counter(data["outcomes"]),
            Counter(data["rejections"]),
            Counter(data.get("rejected_at", {})),  # absent from the state of a run begun by an older version
        )


@dataclass(frozen=True, slots=True)
class Limits:
    """Tokens each stage may generate. A summary is plain text with a fixed budget; a JSON answer's budget is
    what its schema allows (prompts.answer_tokens), and under a `cap` the schema asks for fewer operations so
    that the answer still closes within it."""

    summary: int = 256
    cap: int | None = None

    @classmethod
    def capped(cls, most: int | None) -> Limits:
        return cls() if most is None else cls(min(cls().summary, most), most)


# --- the rollouts file --------------------------------------------------------------------------------------


def read_jsonl(path: Path, what: str) -> list[tuple[int, dict[str, Any]]]:
    """(line number, object) for each non-blank line of a JSONL file; a bad line is an error naming it."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_ROLLOUT_FILE_BYTES + 1)
    except OSError as exc:
        raise RolloutsError("input.read", f"{path}: cannot read ({exc.strerror})") from None
    if len(data) > MAX_ROLLOUT_FILE_BYTES:
        raise RolloutsError("input.size", f"{path}: larger than {MAX_ROLLOUT_FILE_BYTES} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RolloutsError("input.utf8", f"{path}: byte {exc.start} is not UTF-8") from None
    lines = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except ValueError as exc:
            raise RolloutsError("input.json", f"{path}:{number}: not JSON ({exc})") from None
        if not isinstance(value, dict):
            raise RolloutsError("input.json", f"{path}:{number}: expected a JSON object ({what})")
        lines.append((number, value))
    if not lines:
        raise RolloutsError("input.empty", f"{path}: holds no {what}")
    return lines


def string_field(value: dict[str, Any], name: str, where: str, default: str | None = None) -> str:
    found = value.get(name, default)
    if not isinstance(found, str) or not found.strip():
        raise RolloutsError("input.field", f"{where}: {name}: expected a non-empty string")
    if len(found) > MAX_TEXT_CHARS:
        raise RolloutsError("input.field", f"{where}: {name}: longer than {MAX_TEXT_CHARS} characters")
    return found


def domain_field(value: dict[str, Any], where: str, params: NetworkParams) -> str:
    domain = string_field(value, "domain", where, "general")
    labels = domain.split(".")
    if not 1 <= len(labels) <= params.max_domain_depth or not all(
        re.fullmatch(r"[a-z][a-z0-9_-]{0,31}", label) for label in labels
    ):
        raise RolloutsError(
            "input.field", f"{where}: domain: {domain[:60]!r} is not a path of labels like math.geometry"
        )
    return domain


def read_rollouts(path: Path, params: NetworkParams) -> list[Group]:
    """Each line: {"problem", "answer", "domain"?, "rollouts": [{"trajectory", "correct", "reward"?,
    "experiences"?}]}; "experiences" are the CIDs that were in the rollout's context."""
    groups = []
    for number, value in read_jsonl(path, "rollout groups"):
        where = f"{path}:{number}"
        rollouts = value.get("rollouts")
        if not isinstance(rollouts, list) or not rollouts:
            raise RolloutsError("input.field", f"{where}: rollouts: expected a non-empty list")
        parsed = []
        for index, item in enumerate(rollouts):
            at = f"{where}: rollouts[{index}]"
            if not isinstance(item, dict):
                raise RolloutsError("input.field", f"{at}: expected a JSON object")
            if type(item.get("correct")) is not bool:
                raise RolloutsError("input.field", f"{at}.correct: expected true or false")
            reward = item.get("reward")
            if reward is not None and (type(reward) not in (int, float) or not math.isfinite(reward)):
                raise RolloutsError("input.field", f"{at}.reward: expected a finite number")
            cited = item.get("experiences", [])
            if not isinstance(cited, list) or not all(isinstance(cid, str) for cid in cited):
                raise RolloutsError("input.field", f"{at}.experiences: expected a list of CIDs")
            try:
                experiences = tuple(CID.parse(cid, field=f"{at}.experiences") for cid in cited)
            except CIDError as exc:
                raise RolloutsError("input.field", exc.message) from None
            parsed.append(Rollout(string_field(item, "trajectory", at), item["correct"], reward, experiences))
        groups.append(
            Group(
                string_field(value, "problem", where),
                string_field(value, "answer", where),
                domain_field(value, where, params),
                tuple(parsed),
            )
        )
    return groups


# --- the three stages ---------------------------------------------------------------------------------------


@dataclass
class _Shown:
    """The experiences a prompt shows, under short ids."""

    ids: ShortIds
    entries: dict[CID, Entry] = field(default_factory=dict)

    def show(self, entries: Iterable[Entry | None]) -> list[prompts.Shown]:
        shown: dict[str, prompts.Shown] = {}
        for entry in entries:
            if entry is not None:
                self.entries[entry.id] = entry
                short = self.ids.name(entry.id)
                shown[short] = prompts.Shown(short, entry.text)
        return list(shown.values())


@dataclass
class _GroupWork:
    number: int
    group: Group
    shown: list[prompts.Shown]
    suggestions: list[dict[str, Any]] = field(default_factory=list)


class Extractor:
    """The DSO pipeline for one batch of groups, against one node, signing with one author key."""

    def __init__(
        self,
        llm: LlmClient,
        node: NodeLink,
        key: AuthorKey,
        params: NetworkParams,
        embedder: Embedder,
        *,
        k: int = DEFAULT_K,
        limits: Limits = Limits(),
        now: Any = time.time,
    ) -> None:
        self.llm, self.node, self.key, self.params, self.embedder = llm, node, key, params, embedder
        self.k, self.limits, self.now = k, limits, now

    def extract(self, groups: Sequence[Group]) -> tuple[list[Block], Report]:
        """Signed, validated operations for a batch of groups, and the accounting of how they came about."""
        report = Report(groups=len(groups))
        shown = _Shown(ShortIds())
        work: list[_GroupWork] = []
        for number, group in enumerate(groups, 1):
            if not group.mixed:
                report.skipped_uniform += 1
                outcome = "correct" if group.correct else "wrong"
                log.info("dso: group %d: all %d rollouts %s: no signal, skipped", number, len(group.rollouts), outcome)
                continue
            cited = dict.fromkeys(cid for rollout in group.rollouts for cid in rollout.experiences)
            retrieved = [CID.parse(hit["id"]) for hit in self.node.retrieve(group.problem, self.k)]
            library = shown.show(self.node.entry(cid) for cid in dict.fromkeys([*cited, *retrieved]))
            work.append(_GroupWork(number, group, library))
        for item in work:
            summaries = [self._summarize(item.group, rollout, shown) for rollout in item.group.rollouts]
            self._critique(item, summaries, shown, report)
        suggested = [(item.number, item.suggestions) for item in work if item.suggestions]
        if not suggested:
            return [], report
        proposals = self._consolidate(suggested, shown, report)
        blocks = self._operations(proposals, work, shown, report)
        return blocks, report

    def _summarize(self, group: Group, rollout: Rollout, shown: _Shown) -> tuple[str, bool]:
        context = shown.show(self.node.entry(cid) for cid in rollout.experiences)
        prompt = prompts.summarize(context, group.problem, rollout.trajectory, rollout.correct, group.answer)
        answer = self.llm.complete(
            [{"role": "user", "content": prompt}], purpose="summarize", max_tokens=self.limits.summary
        )
        return (answer.text.strip() or "(the model gave no summary)"), rollout.correct

    def _proposed(
        self, stage: str, where: str, prompt: str, request: tuple[dict[str, Any], int], report: Report
    ) -> list[Any] | None:
        """The proposals in the model's answer to a JSON stage (schema, max_tokens), or None with the reason
        counted: the server failed on the answer, the answer was cut off at its budget, or it holds no JSON."""
        schema, max_tokens = request
        answer: Completion | None = None
        try:
            answer = self.llm.complete(
                [{"role": "user", "content": prompt}], purpose=stage, max_tokens=max_tokens, schema=schema
            )
            return operation_items(answer.text)
        except LlmOutputError as exc:
            report.reject(f"{stage} answer", where, Rejected(exc.code, exc.message))
        except Rejected as rejected:
            if answer is not None and answer.truncated:
                rejected = Rejected("parse.truncated", f"cut off at {max_tokens} tokens: {rejected.detail}")
            report.reject(f"{stage} answer", where, rejected)
        return None

    def _critique(self, item: _GroupWork, summaries: list[tuple[str, bool]], shown: _Shown, report: Report) -> None:
        group = item.group
        prompt = prompts.critique(group.problem, group.answer, item.shown, summaries)
        # a mixed group has an advantage to learn from: the answer holds at least one operation
        request = prompts.fitted_operations_schema(
            CRITIQUE_OPTIONS, MAX_OPS_PER_GROUP, [entry.short_id for entry in item.shown], self.limits.cap, least=1
        )
        where = f"group {item.number}"
        items = self._proposed("critique", where, prompt, request, report)
        if items is None:
            return
        visible = {shown.ids.resolve(entry.short_id) for entry in item.shown}
        for index, raw in enumerate(items):
            if index >= MAX_OPS_PER_GROUP:
                extra = Rejected("group.too_many_ops", f"operation {index + 1} of {len(items)}")
                report.reject("critique", where, extra)
                continue
            try:
                proposal = check_proposal(raw, CRITIQUE_OPTIONS, shown.ids, visible, self.params)
            except Rejected as rejected:
                report.reject("critique", where, rejected)
                continue
            item.suggestions.append(_suggestion(proposal, shown.ids))
            report.suggested += 1

    def _consolidate(
        self, suggested: list[tuple[int, list[dict[str, Any]]]], shown: _Shown, report: Report
    ) -> list[tuple[Proposal, int | None]]:
        library = [prompts.Shown(shown.ids.name(cid), entry.text) for cid, entry in shown.entries.items()]
        most = MAX_OPS_PER_GROUP * len(suggested)
        request = prompts.fitted_operations_schema(
            CONSOLIDATE_OPTIONS,
            most,
            [entry.short_id for entry in library],
            self.limits.cap,
            reason=True,
            merge_most=self.params.max_merge_targets,
        )
        items = self._proposed("consolidate", "batch", prompts.consolidate(library, suggested), request, report)
        if items is None:
            return []
        report.proposed += len(items)
        accepted: list[tuple[Proposal, int | None]] = []
        texts: set[str] = set()
        targeted: set[CID] = set()
        for index, raw in enumerate(items):
            where = f"operation {index + 1}"
            try:
                if index >= most:
                    raise Rejected("batch.too_many_ops", f"{len(items)} operations for {len(suggested)} groups")
                proposal = check_proposal(raw, CONSOLIDATE_OPTIONS, shown.ids, set(shown.entries), self.params)
                if proposal.text is not None and proposal.text.lower() in texts:
                    raise Rejected("op.duplicate", f"the same text twice in one batch: {proposal.text[:60]!r}")
                if targeted & set(proposal.targets):
                    raise Rejected("op.target_taken", "an experience targeted twice in one batch")
            except Rejected as rejected:
                report.reject("consolidate", where, rejected)
                continue
            if proposal.text is not None:
                texts.add(proposal.text.lower())
            targeted.update(proposal.targets)
            accepted.append((proposal, _attribution(proposal, suggested, shown.ids)))
        return accepted

    def _operations(
        self, proposals: list[tuple[Proposal, int | None]], work: list[_GroupWork], shown: _Shown, report: Report
    ) -> list[Block]:
        groups = {item.number: item.group for item in work}
        blocks = []
        for proposal, number in proposals:
            try:
                block = self._build(proposal, groups.get(number) if number else None, work, shown)
            except Rejected as rejected:
                report.reject("build", proposal.option, rejected)
                continue
            blocks.append(block)
            report.operations[proposal.option] += 1
        return blocks

    def _build(self, proposal: Proposal, group: Group | None, work: list[_GroupWork], shown: _Shown) -> Block:
        """The signed operation for a proposal, or Rejected with the ledger's first reason to refuse it."""
        targets = [shown.entries[cid] for cid in proposal.targets]
        mixed = [item.group for item in work]
        source = _source(self.llm.model, group, mixed)[: self.params.max_source_chars]
        # an add builds on everything the batch was shown: its author had seen it
        on = targets or list(shown.entries.values())
        parents = sorted({cid for entry in on for cid in entry.parents}, key=lambda cid: cid.raw)
        parents = parents[: self.params.max_parents]
        clock = 1 + max((entry.clock for entry in on), default=0)
        fields: dict[str, Any] = {}
        kind = Kind(proposal.option)
        if kind is Kind.DELETE:
            fields = {"target": targets[0].id, "reason": proposal.reason or DEFAULT_DELETE_REASON}
        else:
            if kind is Kind.ADD:
                signal = group.signal if group else round(sum(g.signal for g in mixed) / len(mixed), 2)
                domain = group.domain if group else Counter(g.domain for g in mixed).most_common(1)[0][0]
                content = {"domain": domain, "confidence": signal, "examples": _examples(group)}
            elif kind is Kind.MODIFY:
                content = {"domain": targets[0].domain, "confidence": targets[0].confidence}
                fields["target"] = targets[0].id
            else:
                content = {"domain": targets[0].domain, "confidence": max(entry.confidence for entry in targets)}
                fields["targets"] = tuple(entry.id for entry in targets)
                fields["reason"] = proposal.reason or "DSO: the experiences state the same strategy"
            content.update(text=proposal.text, metadata={"source": source})
            try:
                fields["content"] = experience_from_json(content, self.embedder)
            except LedgerError as exc:
                raise Rejected(exc.code, exc.message) from None
        op = Operation(kind, self.key.did, clock, tuple(parents), int(self.now()), **fields)
        block = sign(op, self.key)
        _, errors = examine(block.data, self.params)
        inconsistent = check_embeddings([block], self.embedder, self.params).get(block.cid.raw)
        if inconsistent is not None:
            errors.append(inconsistent)
        if errors:
            raise Rejected(errors[0].code, errors[0].message)
        return block


def _suggestion(proposal: Proposal, ids: ShortIds) -> dict[str, Any]:
    """A checked stage-2 proposal as stage 3 sees it: the seed's JSON, with short ids."""
    item: dict[str, Any] = {"option": proposal.option}
    if proposal.option == "modify":
        item["old_id"] = ids.name(proposal.targets[0])
    if proposal.option == "delete":
        item["exp_id"] = ids.name(proposal.targets[0])
    if proposal.text is not None:
        item["experience"] = proposal.text
    if proposal.reason:
        item["reason"] = proposal.reason
    return item


def _attribution(proposal: Proposal, suggested: list[tuple[int, list[dict[str, Any]]]], ids: ShortIds) -> int | None:
    """The group a final operation came from: named in its reason, else the group that suggested its text."""
    numbers = {number for number, _ in suggested}
    mentioned = [int(found) for found in _GROUP_MENTION.findall(proposal.reason) if int(found) in numbers]
    if len(set(mentioned)) == 1:
        return mentioned[0]
    for number, items in suggested:
        if any(item.get("experience") == proposal.text and proposal.text for item in items):
            return number
    if len(suggested) == 1:
        return suggested[0][0]
    return None


def _source(model: str, group: Group | None, mixed: list[Group]) -> str:
    """Provenance: the model, the problem's hash and the group's statistics (or the batch's)."""
    if group is not None:
        stats = f"problem={group.problem_hash} rollouts={len(group.rollouts)} correct={group.correct}"
    else:
        batch = hashlib.sha256("\n".join(sorted(g.problem for g in mixed)).encode()).hexdigest()[:12]
        rollouts = sum(len(g.rollouts) for g in mixed)
        stats = f"batch={batch} groups={len(mixed)} rollouts={rollouts} correct={sum(g.correct for g in mixed)}"
    return f"dso {stats} model={model}"


def _examples(group: Group | None) -> list[dict[str, Any]]:
    """One correct and one wrong rollout of the group, shortened: the format seed's examples."""
    if group is None:
        return []
    found = []
    for outcome in (True, False):
        rollout = next((item for item in group.rollouts if item.correct is outcome), None)
        if rollout is not None:
            found.append(
                {
                    "input": group.problem[:EXAMPLE_CHARS],
                    "output": rollout.trajectory[-EXAMPLE_CHARS:],
                    "correct": outcome,
                }
            )
    return found


# --- submission ---------------------------------------------------------------------------------------------


def submit(node: NodeLink, blocks: Sequence[Block], report: Report) -> None:
    """Submit each operation; count the node's outcomes (a refusal is counted as a rejection, never lost)."""
    for block in blocks:
        try:
            receipt = node.submit(block)
        except RpcFailed as exc:
            report.rejections[f"node.{exc.code}"] += 1
            log.warning("dso: the node refused %s %s (%s): %s", block.op.kind, block.cid, exc.code, exc.message)
            continue
        report.outcomes[receipt["outcome"]] += 1
        report.cids.append(receipt["cid"])
        log.info("dso: submitted %s %s: %s", block.op.kind, block.cid, receipt["outcome"])
    node.forget()


def dry_run_lines(blocks: Sequence[Block]) -> list[str]:
    """JSON lines for --dry-run: what would be submitted, with the operation's hex for `expledger submit`."""
    lines = []
    for block in blocks:
        op = block.op
        line: dict[str, Any] = {"cid": str(block.cid), "kind": op.kind.value, "clock": op.clock}
        if op.content is not None:
            line.update(text=op.content.text, domain=".".join(op.content.domain), source=op.content.source)
        targets = [op.target] if op.target is not None else list(op.targets)
        if targets:
            line["targets"] = [str(cid) for cid in targets]
        if op.reason is not None:
            line["reason"] = op.reason
        line["hex"] = block.data.hex()
        lines.append(json.dumps(line, ensure_ascii=False))
    return lines
