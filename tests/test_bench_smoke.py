"""The ledger benchmarks the README quotes still run: each at a tiny size, as a process, printing its figures."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _process(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "BENCH_DIR": str(tmp_path)}
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def _run(tmp_path: Path, *args: str) -> str:
    result = _process(tmp_path, *args)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


def test_bench_ledger_prints_every_figure(tmp_path: Path) -> None:
    # a horizon of 64 clocks: the workload's 3,000 operations give the repeated insight's copies room for two rounds
    # of splits and joins at the last checkpoint (its copies are 40-120 clocks apart)
    args = ("--ops", "3000", "--checkpoints", "1000", "--batch", "100", "--absorption-horizon", "64")
    out = _run(tmp_path, "bench.bench_ledger", *args)
    figures = ("decode+validate+verify", "ingest per tenth", "CPU per op, writer", "CPU per op, other threads")
    probes = ("late add", "largest component", "a copy that sorts first", "one after it", "late on early members")
    probes += ("the repeated insight (", "a split", "a join")
    for figure in (*figures, "last tenth / first", *probes, "queries during", "disk"):
        assert figure in out, out
    # a split moving a delete and a join of a deleted experience are folded where they sort
    assert re.search(r"a join of the deleted experience [\d.,]+ ms \(folded 0 operations again\)", out), out
    # the copy that sorts first takes the component's copies over
    assert int(re.search(r"takes over ([\d,]+) adds", out).group(1).replace(",", "")) > 0, out


def test_bench_ledger_runs_with_the_networks_horizon_and_says_when_a_split_does_not_fit(tmp_path: Path) -> None:
    out = _run(tmp_path, "bench.bench_ledger", "--ops", "3000", "--checkpoints", "3000", "--batch", "100")
    assert "the repeated insight spans too few clocks to split and join it" in out, out
    # with the network's horizon the largest component has roots to spare: a merge of two of them sorting before
    # most of the component is folded where it sorts
    assert re.search(r"sorting just after them [\d.,]+ ms \(folds 0 operations again\)", out), out
    # and a merge of an add a merge after it took: that merge is taken back and folded again after the late one,
    # which it takes instead, with what acted on it since: a handful of operations, not the component's. How many
    # acted on it depends on the workload's vectors, which follow the processor's BLAS kernel (its order of summing
    # a norm rounds a few texts in a hundred to other float16 vectors: ../shared/notes/embeddings.md): 1, 2 or 3
    late = re.search(
        r"a merge took and a new add, sorting just after them, [\d.,]+ ms \(folds (\d+) operations again, of the "
        r"(\d+) of its component sorting after it\)",
        out,
    )
    assert late, out
    folded, after = int(late.group(1)), int(late.group(2))
    assert 1 <= folded <= 8 and folded < after, out
    # and a copy taking adds out of an experience an applied merge and a delete name: it rewinds what it touches (the
    # merge and what acted on it), not the component
    assert re.search(r"an applied merge and a delete name, [\d.,]+ ms \(folds \d operations again\)", out), out


def test_disk_counts_a_file_with_two_names_once(tmp_path: Path) -> None:
    from bench.bench_ledger import _disk_bytes

    (tmp_path / "links").mkdir()
    (tmp_path / "000005.ldb").write_bytes(b"x" * 1000)
    os.link(tmp_path / "000005.ldb", tmp_path / "links" / "000005.ldb")  # LevelDB's table links
    (tmp_path / "LOG").write_bytes(b"y" * 10)
    assert _disk_bytes(tmp_path) == 1010


def test_bench_window_prints_every_phase(tmp_path: Path) -> None:
    out = _run(tmp_path, "bench.bench_window", "--at", "1000", "--width", "1000")
    for phase in ("triage", "embedding check", "signature wait", "store + fold", "commit", "receipts", "queries"):
        assert phase in out, out


def test_bench_window_runs_again_from_a_kept_directory(tmp_path: Path) -> None:
    """`--keep` saves the filled directory; `--start-from` runs the same window on a copy of it: the library it
    reaches is the one a fill reaches. A directory of another size, a `--keep` that exists and a `--start-from`
    that does not are refused."""
    kept, window = tmp_path / "kept", ("--width", "500", "--no-queries")
    filled = _run(tmp_path, "bench.bench_window", "--at", "1000", *window, "--keep", str(kept))
    copied = _run(tmp_path, "bench.bench_window", "--at", "1000", *window, "--start-from", str(kept))

    def summary(out: str) -> list[str]:  # "window of 500 operations after 1,000 (N live)", less the machine's load
        return [line.split(", load")[0] for line in out.splitlines() if line.startswith("window of")]

    assert len(summary(filled)) == 1 and summary(filled) == summary(copied)
    assert "per unit of the signature threads'" in copied
    refused = _process(tmp_path, "bench.bench_window", "--at", "2000", *window, "--start-from", str(kept))
    assert refused.returncode == 2 and "holds 1,000 operations, not --at 2,000" in refused.stderr
    for flag, where, why in (("--keep", kept, "exists"), ("--start-from", tmp_path / "none", "is not a directory")):
        refused = _process(tmp_path, "bench.bench_window", "--at", "1000", *window, flag, str(where))
        assert refused.returncode == 2 and f"{flag}: {where} {why}" in refused.stderr


def test_thread_cpu_skips_a_thread_that_ends_while_its_files_are_read(monkeypatch) -> None:
    """A thread may end between listing /proc/self/task and reading its files (the index thread ends whenever its
    backlog empties): reading them then raises ProcessLookupError, which once ended a benchmark run."""
    from bench.bench_ledger import _threads_cpu

    release = threading.Event()
    ending = threading.Thread(target=release.wait)
    ending.start()
    real_read = Path.read_text

    def read_text(self: Path, *args: object, **kwargs: object) -> str:
        if self.parent.name == str(ending.native_id) and self.name == "comm":
            raise ProcessLookupError(3, "No such process")
        return real_read(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", read_text)
    try:
        threads = _threads_cpu()
    finally:
        release.set()
        ending.join()
    assert ending.native_id not in threads and threads  # the others are still counted


def test_bench_usage_prints_its_figures(tmp_path: Path) -> None:
    out = _run(tmp_path, "bench.bench_usage", "--serves", "40", "--threads", "4")
    for figure in ("synced, one thread", "unsynced, one thread (baseline)", "4 threads at once", "ratio"):
        assert figure in out, out


def test_bench_dso_eval_grades_both_arms(tmp_path: Path) -> None:
    """Against a fake model that answers right only when the library's template is in the prompt: the arms'
    accuracies are 0 and 1 wherever an experience was injected."""
    import json

    from tests.dso_fakes import Reply, fake_llm

    problems = [json.loads(line) for line in (ROOT / "bench" / "eval" / "problems.jsonl").read_text().splitlines()]
    answers = {problem["problem"]: problem["answer"] for problem in problems}

    def reply(request: dict) -> Reply:
        prompt = request["messages"][-1]["content"]
        question = prompt.rsplit("# Problem\n\n", 1)[-1]
        return Reply(f"Answer: {answers[question]}" if prompt.startswith("# Learned Experiences") else "Answer: -1")

    with fake_llm(reply) as fake:
        out = _run(tmp_path, "bench.bench_dso", "--eval", "--base-url", fake.url, "--limit", "3", "-G", "2")
    served = int(re.search(r"at least one experience: (\d)/3", out).group(1))
    assert re.search(r"without library\s+0/6\s+0\.000", out), out
    assert re.search(rf"with library\s+{2 * served}/6 ", out), out
    assert "95% paired bootstrap over problems" in out, out


def test_bench_slowloris_prints_both_phases_and_what_the_attackers_met(tmp_path: Path) -> None:
    limits = ("--max-connections", "16", "--header-timeout", "1")  # 40 attackers for 16 places: some are evicted
    # a byte a second: the attackers get 4 s to fill the server before the calls are measured, not the default 8
    attack = ("--attackers", "40", "--trickle", "1", "--seconds", "2", "--baseline", "1")
    out = _run(tmp_path, "bench.bench_slowloris", *attack, *limits)
    assert re.search(r"baseline +\d+/\d+ answered", out) and re.search(r"attack +\d+/\d+ answered", out), out
    assert re.search(r"attackers: \d+ connections opened", out) and "evicted" in out, out
