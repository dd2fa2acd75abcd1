"""`expledger daemon --detach`: start the daemon in the background and return once it is ready.

This process only starts the daemon and waits for its readiness line, so it imports none of the daemon's stack
(numpy, LevelDB, trio: ~0.5 s of CPU for every node a script or `expledger devnet up` starts)."""

from __future__ import annotations

import select
import subprocess
import sys
import time

from node.home import Home

DETACH_TIMEOUT = 120.0  # seconds `--detach` waits for the background daemon to say it is ready
LOG_FILE = "daemon.log"  # a detached daemon's stderr, in its home
EXIT_REFUSED = 2  # a start refused: the daemon's exit status, and this process's when the daemon gave up


def detach(home: Home, log_level: str | None = None) -> int:
    """Start the daemon in the background (its own session, logs in HOME/daemon.log) and return once it is
    ready, or with its error if it could not start: a script can use the node on the next line."""
    home.require()
    argv = [sys.executable, "-m", "node.cli", "daemon", "--home", str(home.path)]
    if log_level:
        argv += ["--log-level", log_level]
    log_path = home.path / LOG_FILE
    with open(log_path, "ab") as log_file:
        child = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log_file, start_new_session=True
        )
    assert child.stdout is not None
    deadline = time.monotonic() + DETACH_TIMEOUT
    while (remaining := deadline - time.monotonic()) > 0:
        if not select.select([child.stdout], [], [], remaining)[0]:
            continue
        line = child.stdout.readline().decode(errors="replace").strip()
        if not line:  # it is exiting before it was ready
            break
        if line.startswith("expledger daemon ready"):  # the daemon's only line on stdout
            child.stdout.close()
            print(f"{line} (pid {child.pid}, logs in {log_path})")
            return 0
    # the pipe ends when the child's files close, before its exit is reported: tearing down a process this
    # large takes a while (seconds under load), so wait for the exit rather than poll once
    try:
        status: int | None = child.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        status = None
    if status is None:
        child.terminate()
        print(
            f"expledger: error: the daemon did not get ready within {DETACH_TIMEOUT:.0f} s; see {log_path}",
            file=sys.stderr,
        )
        return EXIT_REFUSED
    errors = [line for line in log_path.read_text(errors="replace").splitlines() if "error" in line][-1:]
    print(errors[0] if errors else f"expledger: error: the daemon exited ({status}); see {log_path}", file=sys.stderr)
    return EXIT_REFUSED
