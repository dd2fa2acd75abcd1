"""The README, kept true: its single-node section run as written in a fresh directory (a node starts,
answers the CLI and curl, takes operations signed offline, and every one of them takes effect); its
Quickstart's two commands are the ones the demo test and CI run; its devnet commands are the ones
docs/DEVNET.md's test runs; every `expledger` line parses; its configuration table is the code's.

The shell blocks of the single-node section run in order as one bash script (`set -euo pipefail`, so
bash stops at the first command that fails). One line is not run: `source .venv/bin/activate`, whose
effect — the virtual environment's `bin` first on PATH — the test gives the script directly. One
line is changed: `expledger init` gets `--rpc 127.0.0.1:0`, so the node listens on a free port
instead of the default 8645 (which a node of the reader's may be using). The script exports its
own EXPLEDGER_HOME inside the fresh directory; whatever happens, the test stops the daemon it
started by the PID in that home.
"""

import json
import os
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from devnet.cli import build_parser as devnet_parser
from ledger.ledger import Ledger
from ledger.ops import Kind, decode_block
from ledger.records import Life, Outcome
from node.cli import build_parser as node_parser
from node.config import _SCHEMA, Config

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
SINGLE_NODE = "A single node: the CLI and curl"
NOT_RUN = {"source .venv/bin/activate"}
INIT = "expledger init"
FREE_PORTS = "--rpc 127.0.0.1:0 --p2p /ip4/127.0.0.1/tcp/0"  # the defaults may be taken on a test machine


def sh_blocks(text: str, section: str) -> list[str]:
    """The ```sh blocks of a `## section` of a Markdown text."""
    body = text.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```sh\n(.*?)```", body, flags=re.DOTALL)


def quickstart_script() -> str:
    """The single-node section's ```sh blocks, joined, without the lines in NOT_RUN and with the init line on free
    ports."""
    lines = "".join(sh_blocks(README.read_text(), SINGLE_NODE)).splitlines()
    skipped = {line.strip() for line in lines if line.strip() in NOT_RUN}
    assert skipped == NOT_RUN, f"the single-node section changed: expected the lines {sorted(NOT_RUN)}"
    inits = [line for line in lines if line.split("#")[0].strip() == INIT]
    assert len(inits) == 1, f"the single-node section changed: expected one `{INIT}` line"
    kept = [line.replace(INIT, f"{INIT} {FREE_PORTS}", 1) if line in inits else line for line in lines]
    return "\n".join(line for line in kept if line.strip() not in NOT_RUN) + "\n"


def _stop_daemon(home: Path) -> None:
    try:
        pid = int((home / "daemon.pid").read_text())
    except (OSError, ValueError):
        return
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        try:
            os.waitpid(pid, 0)  # not our child (the daemon detached): this raises, and we poll instead
        except ChildProcessError:
            for _ in range(200):
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    return
                signal.sigtimedwait([], 0.05)  # wait 50 ms for it to go


@pytest.fixture(scope="module")
def quickstart(tmp_path_factory) -> tuple[Path, str]:
    """The directory the Quickstart ran in, and what it printed."""
    workdir = tmp_path_factory.mktemp("quickstart")
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    env.pop("EXPLEDGER_HOME", None)
    try:
        result = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", quickstart_script()],
            cwd=workdir,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        _stop_daemon(workdir / "node-home")
    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    assert "expledger: error" not in result.stderr and "Traceback" not in result.stderr, result.stderr
    return workdir, result.stdout


def test_the_node_answers_the_cli_and_curl(quickstart):
    _, printed = quickstart
    assert printed.count("applied add bafyrei") == 2 + 2  # two adds over RPC, two submitted
    assert "expledger daemon ready: rpc http://127.0.0.1:" in printed
    assert "When solving geometry problems with intersections, validate" in printed  # retrieve found it
    assert "# Learned Experiences\n\n1. When solving geometry problems" in printed
    curl = json.loads(next(line for line in printed.splitlines() if line.startswith('{"jsonrpc"')))
    assert curl["result"]["hits"][0]["domain"] == "math.geometry.intersection"
    assert "status: live" in printed and "support: 2" in printed and "votes: +1 -0" in printed
    assert printed.rstrip().endswith("stopped")


def test_every_offline_operation_takes_effect(quickstart, tmp_path):
    workdir, _ = quickstart
    blocks = {path.name: decode_block(path.read_bytes()) for path in sorted(workdir.glob("*.cbor"))}
    assert sorted(block.op.kind for block in blocks.values()) == sorted([Kind.ADD, Kind.ADD, Kind.VOTE, Kind.MERGE])
    ledger = Ledger.open(workdir / "node-home" / "data")  # the node the Quickstart ran, now stopped
    try:
        view = ledger.view()
        for name, block in blocks.items():
            assert view.status(block.cid).outcome is Outcome.APPLIED, name
        (vote,) = (block for block in blocks.values() if block.op.kind is Kind.VOTE)
        (merge,) = (block for block in blocks.values() if block.op.kind is Kind.MERGE)
        for source in merge.op.targets:  # the merge applied: its sources are aliases of the merged experience
            assert view.experience(source).status is Life.ALIAS
            assert view.resolve(source) == merge.cid
        merged = view.experience(merge.cid)
        assert merged.status is Life.LIVE and merged.up == 1  # the vote counts for it
        assert vote.op.target in merged.absorbed and sorted(merged.absorbed) == sorted(merge.op.targets)
    finally:
        ledger.close()


def test_the_merge_carries_what_merged_json_shows(quickstart):
    workdir, _ = quickstart
    shown = json.loads((workdir / "merged.json").read_text())
    merge = decode_block((workdir / "merge.cbor").read_bytes())
    assert merge.op.kind is Kind.MERGE and merge.op.content is not None
    assert merge.op.content.text == shown["text"]
    assert ".".join(merge.op.content.domain) == shown["domain"]
    assert merge.op.content.source == shown["metadata"]["source"]


def test_the_quickstart_is_the_demo_and_the_test_command():
    """Two commands: the demo (run from a fresh clone by tests/test_devnet.py) and the test command CI runs."""
    (block,) = sh_blocks(README.read_text(), "Quickstart")
    commands = [line.split("#")[0].strip() for line in block.splitlines()]
    assert commands == ["scripts/demo.sh", "scripts/test.sh"]
    assert "exec scripts/test.sh" in (ROOT / ".ci" / "run").read_text()
    assert '["scripts/demo.sh"]' in (ROOT / "tests" / "test_devnet.py").read_text()


def test_joining_a_devnet_is_what_the_devnet_walkthrough_runs():
    """The README's joining commands are docs/DEVNET.md's, which tests/test_devnet.py runs as written."""
    section = "Joining a devnet from another home"
    readme = sh_blocks(README.read_text(), section)
    assert readme and readme == sh_blocks((ROOT / "docs" / "DEVNET.md").read_text(), section)


def test_every_expledger_line_of_the_readme_parses():
    """Each `expledger …` line of the README's shell blocks is accepted by the CLI's own parsers, so a renamed
    command or flag fails here even for lines no test runs as written (the LLM section's long runs)."""
    blocks = re.findall(r"```sh\n(.*?)```", README.read_text(), flags=re.DOTALL)
    commands = []
    for block in blocks:
        for line in block.replace("\\\n", " ").splitlines():
            for command in line.split("&&"):
                words = shlex.split(command, comments=True)
                commands += [words[1:]] if words[:1] == ["expledger"] else []
    assert len(commands) >= 20
    for words in commands:
        if words[0] == "devnet":
            devnet_parser().parse_args(words[1:])
        else:
            node_parser().parse_args(words)


def test_the_configuration_table_is_the_code():
    """Every key of config.toml, and no other, is in the README's table, with the default `init` writes."""
    section = README.read_text().split("\n## Configuration\n", 1)[1].split("\n## ", 1)[0]
    rows = dict(re.findall(r"^\| `([a-z0-9_]+\.[a-z_]+)` \| `(.*?)` \|", section, flags=re.MULTILINE))
    expected = {f"{name}.{key}" for name, keys in _SCHEMA.items() for key in keys}
    assert set(rows) == expected
    config = Config()
    for dotted, shown in rows.items():
        name, key = dotted.split(".")
        value = getattr(getattr(config, name), key)
        assert json.loads(shown) == (list(value) if isinstance(value, tuple) else value), dotted


AGENTS = "Agents: the proxy and the Python client"
SPEED = "When computing an average speed, divide the total distance by the total time; never multiply them."


def test_the_agent_example_runs_against_a_node_and_its_proxy(tmp_path):
    """The README's agent: it retrieves, asks the LLM through the proxy (the fake upstream records what it got)
    and adds an experience; run as written, with EXPLEDGER_HOME naming the node."""
    from tests.daemons import init_home, running
    from tests.dso_fakes import Reply, fake_llm

    section = README.read_text().split(f"\n## {AGENTS}\n", 1)[1].split("\n## ", 1)[0]
    (example,) = re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)
    assert len([line for line in example.splitlines() if line.strip()]) <= 12
    home = tmp_path / "home"
    init_home(home)
    with fake_llm(lambda request: Reply("Speed is 120 / 1.5 = 80. Answer: 80")) as fake:
        with open(home / "config.toml", "a") as config:
            config.write(f'\n[proxy]\nlisten = "127.0.0.1:0"\nupstream = "{fake.url}"\n')
        with running(home) as daemon:
            speed = daemon.call("add", {"text": SPEED, "domain": "math.arithmetic", "confidence": 0.8})["cid"]
            result = subprocess.run(
                [sys.executable, "-c", example],
                env={**os.environ, "EXPLEDGER_HOME": str(home)},
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert result.returncode == 0, result.stderr
            lines = result.stdout.splitlines()
            assert lines[0].endswith(SPEED)  # retrieved
            assert lines[-2] == f"Speed is 120 / 1.5 = 80. Answer: 80 ['{speed}']"  # answered through the proxy
            assert lines[-1] == "applied"  # and its lesson added
            (sent,) = fake.requests
            assert SPEED in sent["messages"][-1]["content"]
            assert daemon.call("status")["live_experiences"] == 2
