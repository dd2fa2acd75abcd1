"""`expledger dso run`: the training-free loop. Per batch of problems: retrieve experiences from the node
and inject them with the retrieval seed's context template, sample G rollouts from the policy model at
temperature 0.7, grade them, extract operations (node.dso.extract) and submit them.

Progress is saved after every batch in a state file (written atomically), so a run that is interrupted
resumes where it stopped; the per-epoch report (accuracy, library size, operations by kind, rejections by
reason) is part of that state.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from ledger.cid import CID
from ledger.params import NetworkParams
from node.dso import prompts
from node.dso.extract import Extractor, Group, Report, Rollout, RolloutsError, domain_field, read_jsonl, string_field
from node.dso.extract import submit as submit_blocks
from node.dso.grading import Grader
from node.dso.llm import LlmClient
from node.dso.nodelink import NodeLink

log = logging.getLogger("expledger.dso")

STATE_VERSION = 1
TEMPERATURE = 0.7  # the hyperparameter table's sampling temperature


@dataclass(frozen=True, slots=True)
class Problem:
    problem: str
    answer: str
    domain: str


def read_problems(path: Path, params: NetworkParams) -> list[Problem]:
    """Each line: {"problem", "answer", "domain"?}."""
    problems = []
    for number, value in read_jsonl(path, "problems"):
        where = f"{path}:{number}"
        problems.append(
            Problem(
                string_field(value, "problem", where),
                string_field(value, "answer", where),
                domain_field(value, where, params),
            )
        )
    return problems


@dataclass
class EpochTally:
    """One epoch's counts so far."""

    rollouts: int = 0
    correct: int = 0
    report: Report = field(default_factory=Report)
    library_size: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "rollouts": self.rollouts,
            "correct": self.correct,
            "accuracy": round(self.correct / self.rollouts, 4) if self.rollouts else None,
            "library_size": self.library_size,
            **self.report.to_json(),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> EpochTally:
        return cls(data["rollouts"], data["correct"], Report.from_json(data), data["library_size"])


@dataclass
class RunState:
    """Where a run stands: the next batch to do, and the tallies of the epochs so far."""

    fingerprint: str
    epoch: int = 0
    batch: int = 0
    epochs: list[EpochTally] = field(default_factory=list)

    def save(self, path: Path) -> None:
        body = {
            "version": STATE_VERSION,
            "fingerprint": self.fingerprint,
            "epoch": self.epoch,
            "batch": self.batch,
            "epochs": [tally.to_json() for tally in self.epochs],
        }
        temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        temporary.write_text(json.dumps(body, indent=2) + "\n")
        os.replace(temporary, path)

    @classmethod
    def load(cls, path: Path, fingerprint: str) -> RunState:
        """The saved state of this same run, or a fresh one; a state file of another run is refused."""
        if not path.exists():
            return cls(fingerprint)
        try:
            data = json.loads(path.read_text())
            if data["version"] != STATE_VERSION:
                raise ValueError(f"version {data['version']}")
            state = cls(
                data["fingerprint"], data["epoch"], data["batch"], [EpochTally.from_json(e) for e in data["epochs"]]
            )
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise RolloutsError("state.read", f"{path}: not a dso run state ({exc}); remove it to start over") from None
        if state.fingerprint != fingerprint:
            raise RolloutsError(
                "state.mismatch",
                f"{path}: holds the state of another run (other problems or settings); "
                "give another --state or remove it to start over",
            )
        return state


@dataclass
class Runner:
    """The loop over epochs and batches; every model call goes through `policy` (rollouts) and the extractor."""

    policy: LlmClient
    extractor: Extractor
    node: NodeLink
    grader: Grader
    group_size: int
    batch_size: int
    k: int
    rollout_tokens: int
    progress: TextIO = sys.stderr

    def run(self, problems: list[Problem], epochs: int, state: RunState, state_path: Path) -> RunState:
        batches = [problems[start : start + self.batch_size] for start in range(0, len(problems), self.batch_size)]
        while state.epoch < epochs:
            if len(state.epochs) <= state.epoch:
                state.epochs.append(EpochTally())
            tally = state.epochs[state.epoch]
            while state.batch < len(batches):
                self._batch(
                    batches[state.batch],
                    tally,
                    f"epoch {state.epoch + 1}/{epochs} batch {state.batch + 1}/{len(batches)}",
                )
                state.batch += 1
                state.save(state_path)
            tally.library_size = self.node.status()["live_experiences"]
            self._say(f"epoch {state.epoch + 1}/{epochs} done: {render_epoch(tally)}")
            state.epoch, state.batch = state.epoch + 1, 0
            state.save(state_path)
        return state

    def _batch(self, batch: list[Problem], tally: EpochTally, where: str) -> None:
        groups = []
        for index, problem in enumerate(batch, 1):
            group = self._rollouts(problem)
            groups.append(group)
            tally.rollouts += len(group.rollouts)
            tally.correct += group.correct
            self._say(f"{where}: problem {index}/{len(batch)}: {group.correct}/{len(group.rollouts)} correct")
        blocks, report = self.extractor.extract(groups)
        submit_blocks(self.node, blocks, report)
        tally.report.add(report)
        kinds = ", ".join(f"{count} {kind}" for kind, count in sorted(report.operations.items())) or "no operation"
        rejected = sum(report.rejections.values())
        self._say(f"{where}: {kinds} submitted, {rejected} rejected, {report.skipped_uniform} groups without signal")

    def _rollouts(self, problem: Problem) -> Group:
        hits = self.node.retrieve(problem.problem, self.k)
        context = self.node.context(problem.problem, self.k)
        injected = tuple(CID.parse(hit["id"]) for hit in hits if hit["text"] in context)
        messages = [
            {"role": "system", "content": prompts.ANSWER_INSTRUCTION},
            {"role": "user", "content": context},
        ]
        rollouts = []
        for _ in range(self.group_size):
            answer = self.policy.complete(
                messages, purpose="rollout", temperature=TEMPERATURE, max_tokens=self.rollout_tokens
            )
            text = answer.text.strip() or "(empty answer)"
            rollouts.append(Rollout(text, bool(self.grader(text, problem.answer)), None, injected))
        return Group(problem.problem, problem.answer, problem.domain, tuple(rollouts))

    def _say(self, line: str) -> None:
        print(line, file=self.progress, flush=True)


def fingerprint(problems_path: Path, **settings: Any) -> str:
    """What makes two runs the same run: the problems file's bytes and the settings that shape batches."""
    digest = hashlib.sha256(problems_path.read_bytes())
    digest.update(json.dumps(settings, sort_keys=True).encode())
    return digest.hexdigest()[:32]


def render_epoch(tally: EpochTally) -> str:
    shown = tally.to_json()
    accuracy = f"{shown['accuracy']:.1%}" if shown["accuracy"] is not None else "n/a"
    kinds = ", ".join(f"{kind} {count}" for kind, count in shown["operations"].items()) or "none"
    rejections = ", ".join(f"{code} {count}" for code, count in shown["rejections"].items()) or "none"
    return (
        f"accuracy {accuracy} ({tally.correct}/{tally.rollouts}), library {tally.library_size} experiences, "
        f"operations: {kinds}; rejections: {rejections}; groups without signal {tally.report.skipped_uniform}"
    )
