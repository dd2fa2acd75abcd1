"""The README's Quickstart, run as written in a fresh directory: every operation it builds takes effect.

The shell blocks of the Quickstart section run in order as one bash script (`set -euo pipefail`, so
bash runs them line by line and stops at the first command that fails). Two lines are not run: the
test command itself (`scripts/test.sh`, which is what is running this test) and
`source .venv/bin/activate`, whose effect — the virtual environment's `bin` first on PATH — the test
gives the script directly. Then the operations the script wrote are ingested into a fresh node
ledger with the default network parameters and the real model, and what they did is checked.
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ledger.ledger import Ledger
from ledger.ops import Kind, decode_block
from ledger.records import Life, Outcome

README = Path(__file__).resolve().parent.parent / "README.md"
NOT_RUN = {"scripts/test.sh", "source .venv/bin/activate"}


def quickstart_script() -> str:
    """The Quickstart's ```sh blocks, joined, without the lines in NOT_RUN (each must be there)."""
    section = README.read_text().split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```sh\n(.*?)```", section, flags=re.DOTALL)
    lines = "".join(blocks).splitlines()
    skipped = {line.strip() for line in lines if line.strip() in NOT_RUN}
    assert skipped == NOT_RUN, f"the Quickstart changed: expected the lines {sorted(NOT_RUN)}"
    return "\n".join(line for line in lines if line.strip() not in NOT_RUN) + "\n"


@pytest.fixture(scope="module")
def quickstart(tmp_path_factory) -> tuple[Path, str]:
    """The directory the Quickstart ran in, and what it printed."""
    workdir = tmp_path_factory.mktemp("quickstart")
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    result = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", quickstart_script()],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    assert "expledger: error" not in result.stderr and "Traceback" not in result.stderr, result.stderr
    return workdir, result.stdout


def test_every_quickstart_operation_takes_effect(quickstart, tmp_path):
    workdir, _ = quickstart
    blocks = {path.name: decode_block(path.read_bytes()) for path in sorted(workdir.glob("*.cbor"))}
    kinds = sorted(block.op.kind for block in blocks.values())
    assert kinds == sorted([Kind.ADD, Kind.ADD, Kind.VOTE, Kind.MERGE])
    ledger = Ledger.open(tmp_path / "node")
    try:
        receipts = ledger.ingest([block.data for block in blocks.values()])
        assert [receipt.outcome for receipt in receipts] == ["applied"] * len(blocks)
        view = ledger.view()
        for name, block in blocks.items():
            assert view.status(block.cid).outcome is Outcome.APPLIED, name
        (vote,) = (block for block in blocks.values() if block.op.kind is Kind.VOTE)
        (merge,) = (block for block in blocks.values() if block.op.kind is Kind.MERGE)
        voted = view.experience(vote.op.target)
        assert (voted.up, voted.down) == (1, 0)  # the vote is counted
        for source in merge.op.targets:  # the merge applied: its sources are aliases of the merged experience
            assert view.experience(source).status is Life.ALIAS
            assert view.resolve(source) == merge.cid
        merged = view.experience(merge.cid)
        assert merged.status is Life.LIVE and merged.up == 1  # and the vote counts for it
        assert sorted(merged.absorbed) == sorted(merge.op.targets)
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


def test_the_quickstart_prints_what_its_comments_promise(quickstart):
    _, printed = quickstart
    for name in ("add.cbor", "add2.cbor", "vote.cbor", "merge.cbor"):
        assert f"{name} applied" in printed
    assert "merged: live up 1 absorbs 2" in printed
