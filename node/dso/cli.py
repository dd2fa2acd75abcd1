"""`expledger dso extract` and `expledger dso run`: the learning loop as clients of a running node.

The model is any OpenAI-compatible endpoint: [llm] in the home's config.toml, overridden by the
EXPLEDGER_LLM_BASE_URL / _MODEL / _API_KEY variables, overridden by --base-url and --model.
Operations are signed by --key (default: the home's author key). Exit status: 0 success, 1 the
node refused something, 2 bad arguments or input, 3 no daemon answers, 4 the model's endpoint failed.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

from ledger.errors import LedgerError
from ledger.keys import AuthorKey
from node import client, logs
from node.home import Home

EXIT_LLM = 4


def add_commands(commands: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """`expledger dso …`: how experiences are made from rollouts with an LLM."""
    dso = commands.add_parser("dso", help="extract experiences from rollouts with an LLM (the DSO learning loop)")
    sub = dso.add_subparsers(dest="dso_command", required=True)
    shared = argparse.ArgumentParser(add_help=False, parents=[common])
    shared.add_argument("--key", type=Path, help="author key that signs the operations (default: the home's)")
    shared.add_argument("--base-url", help="the OpenAI-compatible endpoint, e.g. http://127.0.0.1:8080/v1")
    shared.add_argument("--model", help="the model that extracts (default: [llm] model, else the server's first)")
    shared.add_argument(
        "--max-retries",
        type=int,
        help="retries of a call that timed out, could not connect or got a 429 or 5xx (default: [llm] max_retries)",
    )
    shared.add_argument("-k", type=int, default=5, help="experiences retrieved per problem (default 5)")
    shared.add_argument(
        "--max-tokens",
        type=int,
        help="cap on the tokens of each extraction answer (JSON answers then ask for fewer operations)",
    )
    shared.add_argument("--log-level", choices=["debug", "info", "warning", "error"], default="info")
    extract = sub.add_parser("extract", parents=[shared], help="the three DSO stages on a file of rollout groups")
    extract.add_argument("--rollouts", type=Path, required=True, metavar="FILE.jsonl", help="one group per line")
    extract.add_argument(
        "--dry-run",
        type=Path,
        metavar="FILE",
        help="write the signed operations here (JSON lines) instead of submitting",
    )
    run = sub.add_parser("run", parents=[shared], help="the training loop: rollouts, grading, extraction, per epoch")
    run.add_argument("--problems", type=Path, required=True, metavar="FILE.jsonl", help='{"problem", "answer"} lines')
    run.add_argument("--epochs", type=int, default=3)
    run.add_argument("--group-size", type=int, default=5, help="rollouts per problem, G (the seed: 5 to 8)")
    run.add_argument("--batch-size", type=int, default=4, help="problems per extraction batch")
    run.add_argument("--policy-model", help="the model that solves the problems (default: the extraction model)")
    run.add_argument("--rollout-tokens", type=int, default=512, help="cap on the tokens of each rollout")
    run.add_argument(
        "--grader", metavar="MODULE:FUNCTION", help="grade(response, answer) -> bool (default: exact or numeric match)"
    )
    run.add_argument("--state", type=Path, help="resumable state file (default: HOME/dso-run.json)")


def run(args: argparse.Namespace) -> int:
    """Run a `dso` subcommand; errors become one line on stderr and an exit status."""
    from node.dso.llm import LlmError

    logs.configure(args.log_level, "text")
    for noisy in ("httpx", "httpx2", "httpcore", "httpcore2", "openai"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    try:
        return _run(args)
    except LlmError as exc:
        print(f"expledger: error: {exc.code}: {exc.message}", file=sys.stderr)
        return EXIT_LLM
    except client.DaemonUnavailable as exc:
        print(f"expledger: error: {exc.code}: {exc.message}", file=sys.stderr)
        return client.EXIT_UNAVAILABLE
    except client.RpcFailed as exc:
        print(f"expledger: error: {exc.code}: {exc.message}", file=sys.stderr)
        return client.EXIT_REFUSED


def _positive(value: int | None, flag: str) -> None:
    from node.dso.extract import RolloutsError

    if value is not None and value < 1:
        raise RolloutsError("args.invalid", f"{flag}: must be at least 1, got {value}")


def _run(args: argparse.Namespace) -> int:
    from ledger.embedder import embedder_for
    from node.dso.extract import Extractor, Limits, RolloutsError, dry_run_lines, read_rollouts, submit
    from node.dso.llm import LlmClient, LlmSettings
    from node.dso.nodelink import NodeLink

    for value, flag in ((args.k, "-k"), (args.max_tokens, "--max-tokens")):
        _positive(value, flag)
    if args.max_retries is not None and not 0 <= args.max_retries <= 20:
        raise RolloutsError("args.invalid", f"--max-retries: must be from 0 to 20, got {args.max_retries}")
    home = Home(args.home)
    config, params = home.config(), home.network()
    key = AuthorKey.load(args.key) if args.key else home.author_key()
    node = NodeLink(client.Client(home))
    settings = LlmSettings.resolve(config.llm, base_url=args.base_url, model=args.model, max_retries=args.max_retries)
    llm = LlmClient(settings)
    embedder = embedder_for(params)
    extractor = Extractor(llm, node, key, params, embedder, k=args.k, limits=Limits.capped(args.max_tokens))
    if args.dso_command == "extract":
        groups = read_rollouts(args.rollouts, params)
        blocks, report = extractor.extract(groups)
        if args.dry_run:
            try:
                args.dry_run.write_text("".join(line + "\n" for line in dry_run_lines(blocks)))
            except OSError as exc:
                raise LedgerError("output.write", f"--dry-run {args.dry_run}: cannot write ({exc.strerror})") from None
        else:
            submit(node, blocks, report)
        summary = {**report.to_json(), "submitted": not args.dry_run, "usage": _usage(llm)}
        _print(
            summary,
            args.json,
            f"{len(blocks)} operations {'written to ' + str(args.dry_run) if args.dry_run else 'submitted'}",
        )
        return 0
    return _training(args, home, params, node, llm, extractor)


def _training(args: argparse.Namespace, home: Home, params: Any, node: Any, llm: Any, extractor: Any) -> int:
    from node.dso.grading import load_grader
    from node.dso.llm import LlmClient, LlmSettings
    from node.dso.loop import Runner, RunState, fingerprint, read_problems, render_epoch

    for value, flag in (
        (args.epochs, "--epochs"),
        (args.group_size, "--group-size"),
        (args.batch_size, "--batch-size"),
        (args.rollout_tokens, "--rollout-tokens"),
    ):
        _positive(value, flag)
    problems = read_problems(args.problems, params)
    grader = load_grader(args.grader)
    policy = llm
    if args.policy_model:
        policy = LlmClient(
            LlmSettings.resolve(
                home.config().llm, base_url=args.base_url, model=args.policy_model, max_retries=args.max_retries
            )
        )
    state_path = args.state or home.path / "dso-run.json"
    run_id = fingerprint(
        args.problems, group_size=args.group_size, batch_size=args.batch_size, grader=args.grader, k=args.k
    )
    state = RunState.load(state_path, run_id)
    if state.epoch or state.batch:
        print(f"resuming from {state_path}: epoch {state.epoch + 1}, batch {state.batch + 1}", file=sys.stderr)
    runner = Runner(policy, extractor, node, grader, args.group_size, args.batch_size, args.k, args.rollout_tokens)
    state = runner.run(problems, args.epochs, state, state_path)
    epochs = [{"epoch": number, **tally.to_json()} for number, tally in enumerate(state.epochs, 1)]
    if args.json:
        print(json.dumps({"epochs": epochs, "usage": _usage(llm, policy)}, indent=2))
    else:
        for number, tally in enumerate(state.epochs, 1):
            print(f"epoch {number}: {render_epoch(tally)}")
    return 0


def _usage(*clients: Any) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for llm in dict.fromkeys(clients):
        found.update({purpose: usage.to_json() for purpose, usage in llm.usage.items()})
    return found


def _print(summary: dict[str, Any], as_json: bool, headline: str) -> None:
    if as_json:
        print(json.dumps(summary, indent=2))
        return
    print(headline)
    for name in ("groups", "skipped_uniform", "suggested", "proposed"):
        print(f"{name}: {summary[name]}")
    for name in ("operations", "outcomes", "rejections"):
        counts = ", ".join(f"{key} {value}" for key, value in summary[name].items()) or "none"
        print(f"{name}: {counts}")
    for purpose, usage in summary["usage"].items():
        print(
            f"{purpose}: {usage['calls']} calls, {usage['seconds']} s, "
            f"{usage['prompt_tokens']} prompt + {usage['completion_tokens']} completion tokens, "
            f"{usage['retries']} retries, {usage['truncated']} cut off, {usage['failed']} failed"
        )
