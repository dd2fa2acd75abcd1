"""The disk-full sequence of issue 54 against a real daemon on a small tmpfs: fill the disk while adding, free
space, keep adding, stop (kill -9 or a graceful stop), start; every acknowledged add must be there.

    sudo python -m bench.bench_diskfull [--runs 5] [--size-mb 40] [--min-free-mb 0]

Each run mounts a fresh tmpfs (root only: `mount -t tmpfs`), makes a home on it, starts `expledger daemon`, fills
the disk with a file that leaves `--headroom-mb`, and adds experiences over RPC until the store refuses them
(-32006 `store.unwritable`: with `--min-free-mb 0` after a write that met the full disk, else at the reserve
before it); a few more adds are refused too, then the file is deleted and `--after` more adds are made (the
first of them recovers the store). Runs alternate kill -9 and a graceful stop (SIGTERM). The daemon is started
again: a start that fails names the code (`store.corrupt` is what issue 54 saw, 4 runs of 4), else every
acknowledged add is read back with `get`. Prints a line per run and the totals:
runs / acknowledged / present / corrupt.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench.bench_index import texts
from tests.daemons import LOG, Daemon, init_home, start

UNWRITABLE = -32006
#: adds tried after the first refusal while the disk is still full (each must be refused)
REFUSED_TRIES = 5
#: adds tried before the disk fills, at most (a 40 MB tmpfs with 3 MB free holds ~1,000 more)
MAX_ADDS = 20_000


@dataclass
class Run:
    stop: str  # "kill -9" or "graceful"
    before: int = 0  # adds acknowledged until the store refused one
    refused: int = 0
    after: int = 0  # adds acknowledged once space was freed
    present: int = 0
    state_when_full: str = ""
    message: str = ""  # the first refusal's, as the client saw it
    exit_status: int | None = None  # the daemon's, when it was stopped
    restart: str = "ok"  # or the code the start failed with

    @property
    def acknowledged(self) -> int:
        return self.before + self.after

    @property
    def corrupt(self) -> bool:
        return self.restart == "store.corrupt"

    def line(self, number: int) -> str:
        return (
            f"run {number} ({self.stop}): acknowledged {self.acknowledged} ({self.before} before the disk filled, "
            f"{self.after} after space was freed), refused {self.refused} (state {self.state_when_full}), exit status "
            f"{self.exit_status}, restart {self.restart}, present {self.present}/{self.acknowledged}"
        )


def can_mount() -> str | None:
    """None if this process may mount a tmpfs, else why not."""
    if os.geteuid() != 0:
        return "mounting a tmpfs needs root"
    with tempfile.TemporaryDirectory() as directory:
        result = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", directory], capture_output=True)
        if result.returncode != 0:
            return f"mount -t tmpfs failed: {result.stderr.decode(errors='replace').strip()}"
        subprocess.run(["umount", directory], check=True)
    return None


def _add(daemon: Daemon, text: str) -> tuple[str | None, dict | None]:
    """The new experience's id, or the error."""
    answer = daemon.request("add", {"text": text, "domain": "bench.diskfull", "confidence": 0.8})
    if "error" in answer:
        return None, answer["error"]
    return answer["result"]["status"]["experience"], None


def _start_failure(home: Path) -> str:
    """The code a start that failed logged (`store.corrupt`, ...), or `failed` if it named none."""
    found = re.findall(r"\b(store\.[a-z_]+)\b", (home / LOG).read_text(errors="replace"))
    return found[-1] if found else "failed"


def one_run(directory: Path, stop: str, size_mb: int, min_free_mb: int, headroom_mb: int, after: int) -> Run:
    """Mount a tmpfs of `size_mb` at `directory`, play the sequence, unmount."""
    run, rng = Run(stop), random.Random(54)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs", str(directory)], check=True)
    try:
        home = directory / "home"
        init_home(home, retrieval_model="network")
        config = home / "config.toml"
        config.write_text(re.sub(r"(?m)^min_free_mb = \d+", f"min_free_mb = {min_free_mb}", config.read_text()))
        daemon = start(home)
        acknowledged: list[str] = []
        try:
            filler = directory / "filler"
            stats = os.statvfs(directory)
            filler.write_bytes(b"\0" * max(0, stats.f_bavail * stats.f_frsize - (headroom_mb << 20)))
            for text in texts(MAX_ADDS, rng):
                exp_id, error = _add(daemon, text)
                if exp_id is None:
                    assert error is not None and error["code"] == UNWRITABLE, error
                    run.message = error["message"]
                    break
                acknowledged.append(exp_id)
            else:
                raise RuntimeError(f"{MAX_ADDS} adds and the disk is not full")
            run.before = len(acknowledged)
            for text in texts(REFUSED_TRIES, rng):
                exp_id, error = _add(daemon, text)
                assert exp_id is None and error is not None and error["code"] == UNWRITABLE, (exp_id, error)
                run.refused += 1
            run.refused += 1  # the first
            run.state_when_full = daemon.call("status")["store"]["state"]
            filler.unlink()
            for text in texts(after, rng):
                exp_id, error = _add(daemon, text)
                assert exp_id is not None, error
                acknowledged.append(exp_id)
            run.after = len(acknowledged) - run.before
        finally:
            if stop == "kill -9":
                daemon.process.kill()
            run.exit_status = daemon.stop(signal.SIGTERM)
        try:
            daemon = start(home)
        except RuntimeError:
            run.restart = _start_failure(home)
            return run
        try:
            for exp_id in acknowledged:
                answer = daemon.request("get", {"id": exp_id})
                run.present += "result" in answer
        finally:
            daemon.stop()
        return run
    finally:
        subprocess.run(["umount", "--lazy", str(directory)], check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--size-mb", type=int, default=40, help="the tmpfs's size")
    parser.add_argument("--min-free-mb", type=int, default=0, help="[store] min_free_mb (0: meet the full disk)")
    parser.add_argument("--headroom-mb", type=int, default=3, help="free space the filler file leaves")
    parser.add_argument("--after", type=int, default=200, help="adds made once space is freed")
    args = parser.parse_args()
    why = can_mount()
    if why is not None:
        raise SystemExit(f"bench_diskfull: {why}")
    print(
        f"bench_diskfull: {args.runs} runs on a {args.size_mb} MB tmpfs, [store] min_free_mb = {args.min_free_mb}, "
        f"{args.headroom_mb} MB left by the filler, {args.after} adds after freeing it",
        flush=True,
    )
    runs = []
    started = time.monotonic()
    for number in range(1, args.runs + 1):
        with tempfile.TemporaryDirectory(prefix="diskfull-") as directory:
            stop = "kill -9" if number % 2 else "graceful"
            run = one_run(Path(directory), stop, args.size_mb, args.min_free_mb, args.headroom_mb, args.after)
        runs.append(run)
        print(run.line(number), flush=True)
    acknowledged, present = sum(run.acknowledged for run in runs), sum(run.present for run in runs)
    corrupt = sum(run.corrupt for run in runs)
    failed = sum(run.restart != "ok" for run in runs)
    print(
        f"runs {len(runs)}, acknowledged {acknowledged}, present {present}, corrupt {corrupt}, "
        f"starts refused {failed} ({time.monotonic() - started:.0f} s)"
    )


if __name__ == "__main__":
    main()
