"""`python -m bench.bench_dso --eval`: does an agent do better with the library than without it?

The same held-out problems (bench/eval/problems.jsonl) are each solved G times at temperature 0.7 without and
with the library's context (the retrieval seed's template, from the node's `context` method), graded by the
learning loop's grader, and the accuracy of both arms is printed with 95% Wilson intervals, plus the gain with
a 95% paired bootstrap interval over problems (rollouts of one problem are not independent; problems are).
The arms alternate rollout by rollout, so a machine whose load changes during the run slows both alike.

The library: bench/eval/library.jsonl added to a fresh daemon, or, with --home, whatever library a running
node holds (one `expledger dso run` learned, say). The model: any OpenAI-compatible --base-url and --model;
without --base-url the bundled SmolLM2-135M is served on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from node.client import Client
from node.config import LlmConfig
from node.dso.grading import default_grader
from node.dso.llm import LlmClient, LlmError, LlmSettings, StageUsage
from node.dso.prompts import ANSWER_INSTRUCTION
from node.home import Home

ROOT = Path(__file__).resolve().parent.parent
EVAL_DIR = ROOT / "bench" / "eval"
TRAINING = ROOT / "data" / "dso" / "problems.jsonl"
TEMPERATURE = 0.7
Z95 = 1.959964
BOOTSTRAP_SAMPLES = 10_000


@dataclass(frozen=True, slots=True)
class Problem:
    problem: str
    answer: str
    domain: str


@dataclass
class Outcome:
    """One problem's results: correct rollouts without and with the library, and what was injected."""

    problem: Problem
    without: int = 0
    with_library: int = 0
    injected: int = 0  # experiences in the context


def read_problems(path: Path) -> list[Problem]:
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    return [Problem(item["problem"], item["answer"], item.get("domain", "")) for item in map(json.loads, lines)]


def wilson(correct: int, n: int) -> tuple[float, float]:
    """The 95% Wilson score interval of a proportion (sound near 0 and 1, where a 135M model lives)."""
    if n == 0:
        return (0.0, 1.0)
    p = correct / n
    centre = (p + Z95**2 / (2 * n)) / (1 + Z95**2 / n)
    half = Z95 * math.sqrt(p * (1 - p) / n + Z95**2 / (4 * n * n)) / (1 + Z95**2 / n)
    return (max(0.0, centre - half), min(1.0, centre + half))


def paired_bootstrap(outcomes: list[Outcome], group: int, seed: int = 1) -> tuple[float, float]:
    """The 95% percentile interval of the gain (with - without accuracy), resampling problems."""
    rng = random.Random(seed)
    gains = [(o.with_library - o.without) / group for o in outcomes]
    means = sorted(sum(rng.choices(gains, k=len(gains))) / len(gains) for _ in range(BOOTSTRAP_SAMPLES))
    return (means[int(0.025 * BOOTSTRAP_SAMPLES)], means[int(0.975 * BOOTSTRAP_SAMPLES) - 1])


def evaluate(
    llm: LlmClient, node: Client, problems: list[Problem], group: int, k: int, max_tokens: int
) -> list[Outcome]:
    outcomes = []
    for index, problem in enumerate(problems, 1):
        context = node.call("context", query=problem.problem, k=k)["prompt"]
        injected = len(re.findall(r"(?m)^\d+\. ", context.split("\n---\n")[0])) if "\n---\n" in context else 0
        outcome = Outcome(problem, injected=injected)
        # with nothing to inject the agent's prompt is unchanged (as the proxy forwards it), not the template's bare
        # "# Problem" heading: the arms then differ only where the library has something to say
        arms = {"without": problem.problem, "with": context if injected else problem.problem}
        for _ in range(group):
            for arm, prompt in arms.items():
                messages = [{"role": "system", "content": ANSWER_INSTRUCTION}, {"role": "user", "content": prompt}]
                try:
                    text = llm.complete(
                        messages, purpose=arm, temperature=TEMPERATURE, max_tokens=max_tokens
                    ).text.strip()
                except LlmError as exc:  # one failed answer counts as wrong, as a grader would see it
                    print(f"bench_dso: {arm}: {exc.message}", file=sys.stderr)
                    text = ""
                if default_grader(text, problem.answer):
                    if arm == "with":
                        outcome.with_library += 1
                    else:
                        outcome.without += 1
        print(
            f"bench_dso: {index}/{len(problems)}: without {outcome.without}/{group}, "
            f"with {outcome.with_library}/{group} ({outcome.injected} experiences injected)",
            file=sys.stderr,
        )
        outcomes.append(outcome)
    return outcomes


def report(outcomes: list[Outcome], group: int, llm: LlmClient, base_url: str, library: str, seconds: float) -> str:
    n = len(outcomes) * group
    without, with_library = sum(o.without for o in outcomes), sum(o.with_library for o in outcomes)
    low, high = paired_bootstrap(outcomes, group)
    served = sum(1 for o in outcomes if o.injected)
    lines = [
        f"DSO eval: {llm.model} at {base_url}, {len(outcomes)} held-out problems x G={group}"
        f" at temperature {TEMPERATURE} (n={n} rollouts per arm), library: {library}",
        f"problems given at least one experience: {served}/{len(outcomes)}",
        f"{'arm':<16} {'correct':>8} {'accuracy':>9} {'95% Wilson':>16} {'cut off':>8} {'tokens':>7}",
    ]
    for name, arm, correct in (("without library", "without", without), ("with library", "with", with_library)):
        lo, hi = wilson(correct, n)
        usage = llm.usage.get(arm, StageUsage())
        mean = usage.completion_tokens / usage.calls if usage.calls else 0.0
        shown = f"{correct:>4}/{n:<3} {correct / n:>9.3f}   [{lo:.3f}, {hi:.3f}]"
        lines.append(f"{name:<16} {shown} {usage.truncated:>8} {mean:>7.0f}")
    gain = (with_library - without) / n
    lines.append(f"gain (with - without): {gain:+.3f}, 95% paired bootstrap over problems [{low:+.3f}, {high:+.3f}]")
    lines.append(f"wall time {seconds:.0f} s; load average (1 min) at the end {os.getloadavg()[0]:.1f}")
    return "\n".join(lines)


@contextmanager
def _library_node(home: Path | None, library: Path) -> Iterator[tuple[Client, str]]:
    """A client of the node whose library is used: the given home's running daemon, or a fresh one holding
    `library`."""
    if home is not None:
        node = Client(Home(home))
        yield node, f"the node of {home} ({node.call('status')['live_experiences']} live experiences)"
        return
    from tests.daemons import init_home, running

    with tempfile.TemporaryDirectory() as tmp:
        fresh = Path(tmp) / "home"
        init_home(fresh)
        with running(fresh) as daemon:
            entries = [json.loads(line) for line in library.read_text().splitlines() if line.strip()]
            for entry in entries:
                daemon.call("add", entry)
            yield Client(Home(fresh)), f"{library.relative_to(ROOT) if library.is_relative_to(ROOT) else library}"


@contextmanager
def _endpoint(base_url: str | None, threads: int) -> Iterator[str]:
    if base_url:
        yield base_url
        return
    from tests.dso_fakes import smollm_missing, smollm_server

    missing = smollm_missing()
    if missing:
        raise SystemExit(f"bench_dso: {missing}; or give --base-url")
    print("bench_dso: starting the SmolLM2 server", file=sys.stderr)
    with smollm_server(threads=threads) as url:
        yield url


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_dso --eval", description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-url", help="an OpenAI-compatible endpoint (default: SmolLM2-135M served here)")
    parser.add_argument("--model", help="the model (default: the endpoint's first)")
    parser.add_argument("--api-key", help="default: EXPLEDGER_LLM_API_KEY or OPENAI_API_KEY")
    parser.add_argument("--problems", type=Path, default=EVAL_DIR / "problems.jsonl")
    parser.add_argument("--library", type=Path, default=EVAL_DIR / "library.jsonl", help="experiences, JSON lines")
    parser.add_argument("--home", type=Path, help="use the library of the daemon running on this home instead")
    parser.add_argument("-G", "--group-size", type=int, default=4, help="rollouts per problem and arm (default 4)")
    parser.add_argument("-k", type=int, default=5, help="experiences retrieved per problem (default 5)")
    parser.add_argument("--max-tokens", type=int, default=256, help="cap on each answer (default 256)")
    parser.add_argument("--limit", type=int, help="only the first N problems")
    parser.add_argument(
        "--smollm-threads",
        type=int,
        default=1,
        help="threads of the bundled model's server (default 1: see node.dso.smollm)",
    )
    args = parser.parse_args(argv)
    problems = read_problems(args.problems)[: args.limit]
    training = {p.problem for p in read_problems(TRAINING)}
    leaked = [p.problem for p in problems if p.problem in training]
    if leaked:
        print(f"bench_dso: not held out, in {TRAINING}: {leaked}", file=sys.stderr)
        return 2
    with (
        _endpoint(args.base_url, args.smollm_threads) as url,
        _library_node(args.home, args.library) as (node, library),
    ):
        settings = LlmSettings.resolve(LlmConfig(timeout=600), base_url=url, model=args.model, api_key=args.api_key)
        llm = LlmClient(settings)
        started = time.perf_counter()
        outcomes = evaluate(llm, node, problems, args.group_size, args.k, args.max_tokens)
        print(report(outcomes, args.group_size, llm, url, library, time.perf_counter() - started))
    return 0
