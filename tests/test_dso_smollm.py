"""End to end with a real model: SmolLM2-135M served by llama.cpp (xllamacpp) on 127.0.0.1, a real daemon,
`expledger dso extract` through all three stages. A 135M model's experiences are weak: the test asserts the
pipeline's accounting (every proposal ends as a stored operation or a counted rejection), not its wisdom."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.daemons import EXPLEDGER, init_home, running
from tests.dso_fakes import smollm_missing, smollm_server

ROLLOUTS = Path(__file__).resolve().parent.parent / "data" / "dso" / "rollouts.jsonl"


@pytest.mark.skipif(smollm_missing() is not None, reason=smollm_missing() or "")
def test_extract_with_smollm2_ends_in_valid_operations_or_counted_rejections(tmp_path: Path) -> None:
    home = tmp_path / "home"
    init_home(home)
    with smollm_server() as url, running(home) as node:
        node.call(
            "add",
            {
                "text": "When computing a rate, divide the total quantity by the elapsed time.",
                "domain": "math",
                "confidence": 0.7,
            },
        )
        before = node.call("status")["log_size"]
        result = subprocess.run(
            [
                str(EXPLEDGER),
                "dso",
                "extract",
                "--home",
                str(home),
                "--json",
                "--rollouts",
                str(ROLLOUTS),
                "--max-tokens",
                "96",
            ],
            capture_output=True,
            text=True,
            timeout=600,
            env={**os.environ, "EXPLEDGER_LLM_BASE_URL": url},
        )
        assert result.returncode == 0, result.stderr
        report = json.loads(result.stdout)
        assert (report["groups"], report["skipped_uniform"]) == (3, 1)
        usage = report["usage"]
        assert usage["summarize"]["calls"] == 6 and usage["critique"]["calls"] == 2
        assert all(stage["completion_tokens"] > 0 for stage in usage.values())  # a real model answered each stage
        assert usage.get("consolidate", {"calls": 1})["calls"] == 1
        made = sum(report["operations"].values())
        refused = sum(count for code, count in report["rejections"].items() if code.startswith("node."))
        assert sum(report["outcomes"].values()) + refused == made  # every operation built was submitted and answered
        assert refused == 0  # checked with the ledger's own rules before submission, the node accepts them all
        assert node.call("status")["log_size"] == before + made
        if made == 0:  # then the model's proposals all failed the checks, each counted by reason
            assert report["rejections"] or report["suggested"] == 0
