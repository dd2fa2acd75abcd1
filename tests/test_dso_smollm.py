"""End to end with a real model: SmolLM2-135M served by llama.cpp (xllamacpp) on 127.0.0.1, a real daemon,
`expledger dso extract` through all three stages. A 135M model's experiences are weak: the test asserts the
pipeline's accounting (every proposal ends as a stored operation or a counted rejection), not its wisdom.

One mixed group of two rollouts (and one uniform group, skipped) keeps it to four model calls: two summaries,
one critique, one consolidation. The critique and consolidation answers are constrained by bounded schemas
(node.dso.prompts), so the model's JSON closes within its token budget and its operations pass the checks:
stage 3 always has suggestions to consolidate."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.daemons import EXPLEDGER, init_home, running
from tests.dso_fakes import smollm_missing, smollm_server

GROUPS = [
    {
        "problem": "A train travels 60 km in 1.5 hours. What is its average speed in km/h?",
        "answer": "40",
        "domain": "math.arithmetic",
        "rollouts": [
            {"trajectory": "Speed is distance over time: 60 / 1.5 = 40. Answer: 40", "correct": True},
            {"trajectory": "Speed = 60 * 1.5 = 90. Answer: 90", "correct": False},
        ],
    },
    {
        "problem": "What is 7 + 5?",
        "answer": "12",
        "domain": "math.arithmetic",
        "rollouts": [
            {"trajectory": "7 + 5 = 12. Answer: 12", "correct": True},
            {"trajectory": "12. Answer: 12", "correct": True},
        ],
    },
]


@pytest.mark.skipif(smollm_missing() is not None, reason=smollm_missing() or "")
def test_extract_with_smollm2_runs_all_three_stages_into_valid_operations_or_counted_rejections(
    tmp_path: Path,
) -> None:
    rollouts = tmp_path / "rollouts.jsonl"
    rollouts.write_text("".join(json.dumps(group) + "\n" for group in GROUPS))
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
                str(rollouts),
                "--max-tokens",
                "160",
            ],
            capture_output=True,
            text=True,
            timeout=600,
            env={**os.environ, "EXPLEDGER_LLM_BASE_URL": url},
        )
        assert result.returncode == 0, result.stderr
        report = json.loads(result.stdout)
        assert (report["groups"], report["skipped_uniform"]) == (2, 1)

        # all three stages ran with the real model, and each answered with tokens of its own
        usage = report["usage"]
        assert [usage[stage]["calls"] for stage in ("summarize", "critique", "consolidate")] == [2, 1, 1], (
            report,
            result.stderr,
        )
        assert all(usage[stage]["completion_tokens"] > 0 for stage in ("summarize", "critique", "consolidate"))
        # the JSON answers closed within their budgets, under the format asked for
        assert all(usage[stage]["truncated"] == usage[stage]["failed"] == 0 for stage in ("critique", "consolidate"))
        assert report["suggested"] >= 1

        # every proposal of stage 3 ended as an operation or a rejection counted with its reason
        rejected_at = report["rejected_at"]
        assert "consolidate answer" not in rejected_at, result.stderr
        made = sum(report["operations"].values())
        assert report["proposed"] == made + rejected_at.get("consolidate", 0) + rejected_at.get("build", 0)
        assert sum(rejected_at.values()) == sum(report["rejections"].values()) - sum(
            count for code, count in report["rejections"].items() if code.startswith("node.")
        )
        # every operation built was submitted and accepted: checked with the ledger's own rules beforehand
        assert sum(report["outcomes"].values()) == made
        assert node.call("status")["log_size"] == before + made
