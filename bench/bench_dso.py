"""DSO extraction benchmark: seconds and tokens per group for each stage, with the bundled SmolLM2-135M.

Usage: python -m bench.bench_dso [--rounds 1] [--max-tokens N] [--rollouts data/dso/rollouts.jsonl]
       python -m bench.bench_dso --eval [--base-url URL] [--model NAME] [-G 4] ...  (the gain: bench/dso_eval.py)

A real daemon (with a few experiences) and the real model served by llama.cpp (node.dso.smollm) on
127.0.0.1; the extraction runs in this process, as `expledger dso extract` runs it, --rounds times over the
rollout file's groups. Per mixed group (the only ones that reach the model): stage 1 (one summary per
rollout), stage 2 (one critique), stage 3 (the batch's consolidation, shared by its groups): calls, seconds,
prompt and completion tokens, generation speed, and answers cut off at their budget or failed on by the
server (summaries are plain text and run to their budget; the JSON answers of stages 2 and 3 should close
within theirs, which their schemas size). Without --max-tokens each stage has its own budget: 256 tokens a
summary, what its schema allows a JSON answer. The load average is printed: the machine is shared.
Baseline in the same run: the same pipeline against an instant fake model (tests.dso_fakes), which is the
pipeline's own cost (RPC reads, embedding, signing, validation, submission); the ratio says how much of a
group's time is the model's.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ledger.embedder import embedder_for
from ledger.params import NetworkParams
from node.client import Client
from node.config import LlmConfig
from node.dso.extract import Extractor, Limits, read_rollouts, submit
from node.dso.llm import LlmClient, LlmSettings
from node.dso.nodelink import NodeLink
from node.home import Home
from tests.daemons import init_home, running
from tests.dso_fakes import Reply, fake_llm, smollm_missing, smollm_server, stage

ROOT = Path(__file__).resolve().parent.parent
LIBRARY = [
    ("When computing a rate, divide the total quantity by the elapsed time.", "math.arithmetic"),
    (
        "When counting arrangements of distinct objects, multiply the choices left at each position.",
        "math.combinatorics",
    ),
    ("When an answer seems too large, check whether a quantity was multiplied instead of divided.", "math.arithmetic"),
]
STAGES = ("summarize", "critique", "consolidate")


def instant(request: dict[str, Any]) -> Reply:
    """A model that answers at once, with output the pipeline accepts."""
    name = stage(request)
    if name == "summarize":
        return Reply("Step 1: the rollout applied the rule; the wrong one multiplied instead of dividing.")
    if name in ("critique", "consolidate"):
        text = "When a problem gives a total and a time, divide the total by the time to get the rate."
        return Reply(json.dumps([{"option": "add", "experience": text, "reason": "Group 1"}]))
    return Reply("")


def measure(
    url: str, home: Path, rollouts: Path, rounds: int, max_tokens: int | None
) -> tuple[dict[str, Any], int, float]:
    """Per-stage usage over `rounds` extractions, the mixed groups they handled, and the wall time; prints what
    the extractions made of the model's answers."""
    params = NetworkParams.from_file(home / "network.json")
    llm = LlmClient(LlmSettings.resolve(LlmConfig(timeout=600), {}, base_url=url))
    node = NodeLink(Client(Home(home)))
    extractor = Extractor(
        llm, node, Home(home).author_key(), params, embedder_for(params), limits=Limits.capped(max_tokens)
    )
    groups = read_rollouts(rollouts, params)
    mixed = 0
    started = time.perf_counter()
    for _ in range(rounds):
        blocks, report = extractor.extract(groups)
        submit(node, blocks, report)
        mixed += report.groups - report.skipped_uniform
        print(f"bench_dso: {url}: {json.dumps(report.to_json())}", file=sys.stderr)
    return (
        {name: llm.usage[name].to_json() for name in STAGES if name in llm.usage},
        mixed,
        time.perf_counter() - started,
    )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--eval" in argv:
        from bench import dso_eval

        return dso_eval.main([arg for arg in argv if arg != "--eval"])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--max-tokens", type=int, help="cap on every answer (default: each stage's own budget)")
    parser.add_argument("--rollouts", type=Path, default=ROOT / "data" / "dso" / "rollouts.jsonl")
    args = parser.parse_args(argv)
    missing = smollm_missing()
    if missing:
        print(f"bench_dso: {missing}", file=sys.stderr)
        return 2
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        results = {}
        for label in ("instant", "smollm2"):
            home = Path(tmp) / label
            init_home(home)
            with running(home) as daemon:
                for text, domain in LIBRARY:
                    daemon.call("add", {"text": text, "domain": domain, "confidence": 0.7})
                if label == "instant":
                    with fake_llm(instant) as fake:
                        results[label] = measure(fake.url, home, args.rollouts, args.rounds, args.max_tokens)
                else:
                    print("bench_dso: starting the SmolLM2 server", file=sys.stderr)
                    with smollm_server() as url:
                        results[label] = measure(url, home, args.rollouts, args.rounds, args.max_tokens)
    cap = f"max {args.max_tokens} tokens" if args.max_tokens else "per-stage budgets"
    print(f"DSO extraction per mixed group ({args.rollouts.name}, {args.rounds} rounds, {cap})")
    print(f"load average (1 min) before {load_before:.1f}, after {os.getloadavg()[0]:.1f}, on {os.cpu_count()} cores")
    print(f"{'stage':<12} {'calls':>6} {'seconds':>8} {'prompt tok':>11} {'compl tok':>10} {'tok/s':>7} {'cut':>4}")
    usage, groups, wall = results["smollm2"]
    for name in STAGES:
        found = usage.get(name)
        if not found:
            continue
        speed = found["completion_tokens"] / found["seconds"] if found["seconds"] else 0.0
        print(
            f"{name:<12} {found['calls'] / groups:>6.1f} {found['seconds'] / groups:>8.2f} "
            f"{found['prompt_tokens'] / groups:>11.0f} {found['completion_tokens'] / groups:>10.0f} {speed:>7.0f} "
            f"{found['truncated'] + found['failed']:>4}"
        )
    _, base_groups, base_wall = results["instant"]
    model_seconds = sum(found["seconds"] for found in usage.values()) / groups
    print(f"{'total':<12} {'':>6} {wall / groups:>8.2f}   (wall time per group; model calls {model_seconds:.2f} s)")
    print(f"baseline (instant fake model, same pipeline): {base_wall / base_groups:.3f} s per group")
    print(f"ratio smollm2 / baseline: {wall / groups / (base_wall / base_groups):.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
