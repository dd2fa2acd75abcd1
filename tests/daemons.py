"""Real daemons for tests and benchmarks: `expledger init` a home, start `expledger daemon` as a process,
wait for its readiness line (never a fixed sleep), and stop it by PID whatever happens."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

EXPLEDGER = Path(sys.executable).parent / "expledger"
READY = "expledger daemon ready: rpc "
LOG = "daemon.stderr"  # where a test daemon's stderr goes, in its home
START_TIMEOUT = 60.0


def expledger(*args: str, home: Path | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run the CLI; `home` sets --home (after the subcommand, where the node commands take it)."""
    argv = [str(EXPLEDGER), *args]
    if home is not None:
        argv[2:2] = ["--home", str(home)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)


def expledger_here(*args: str, home: Path | None = None) -> subprocess.CompletedProcess[str]:
    """`expledger` (as `expledger()` runs it) in this process: the exit status, stdout and stderr of the same code,
    without a new interpreter's start-up and imports for each command (~1 s of CPU)."""
    from node.cli import main  # the CLI's imports load only for tests that use it

    argv = list(args)
    if home is not None:
        argv[1:1] = ["--home", str(home)]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = main(argv)
        except SystemExit as exc:  # what the interpreter would turn into the exit status
            status = exc.code if isinstance(exc.code, int) else 1
    return subprocess.CompletedProcess([str(EXPLEDGER), *argv], status, out.getvalue(), err.getvalue())


def init_home(
    home: Path,
    *,
    network: Path | None = None,
    config: str | None = None,
    p2p: str = "",
    retrieval_model: str | None = None,
) -> None:
    """`expledger init` on a free RPC port; `p2p` is its libp2p listen address ("": none, a node on its own;
    /ip4/127.0.0.1/tcp/0: any free port); `config` (TOML) replaces the config it wrote; `retrieval_model` sets
    its `[retrieval] model` (the benchmarks use "network": no background embedding takes their cores)."""
    args = ["init", "--home", str(home), "--rpc", "127.0.0.1:0", "--p2p", p2p]
    if network is not None:
        args = ["--network", str(network), *args]
    result = subprocess.run([str(EXPLEDGER), *args], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    path = home / "config.toml"
    if config is not None:
        path.write_text(config)
    if retrieval_model is not None:  # the written config's only uncommented `model =` is [retrieval]'s
        path.write_text(re.sub(r'(?m)^model = ".*"$', f'model = "{retrieval_model}"', path.read_text(), count=1))


@dataclass
class Daemon:
    """A running `expledger daemon` and an HTTP client holding its token."""

    home: Path
    process: subprocess.Popen[str]
    url: str
    token: str
    http: httpx.Client = field(repr=False)
    _ids: int = 0

    def call(self, method: str, params: Any = None, **options: Any) -> Any:
        """The JSON-RPC result; raises AssertionError with the error object if the call failed."""
        answer = self.request(method, params, **options)
        assert "error" not in answer, answer["error"]
        return answer["result"]

    def request(self, method: str, params: Any = None, **options: Any) -> dict[str, Any]:
        """The whole JSON-RPC response object."""
        self._ids += 1
        body = {"jsonrpc": "2.0", "id": self._ids, "method": method, "params": params or {}}
        response = self.http.post(self.url, json=body, **options)
        assert response.status_code == 200, (response.status_code, response.text)
        return response.json()

    def post(self, body: bytes | str, **headers: str) -> httpx.Response:
        """A raw POST (for malformed requests), authenticated unless headers say otherwise."""
        return self.http.post(self.url, content=body, headers={"Content-Type": "application/json", **headers})

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        """Signal the daemon and wait for it; kill it if it does not exit in time. Returns the exit status."""
        self.http.close()
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process.stdout.close()  # type: ignore[union-attr]
        return self.process.returncode


def start(home: Path, *extra: str, timeout: float = START_TIMEOUT) -> Daemon:
    """Start a daemon on an initialised home and wait until it says it is ready."""
    with open(home / LOG, "a") as log:  # a file, not a pipe: nobody has to drain it for the daemon to go on
        process = subprocess.Popen(
            [str(EXPLEDGER), "daemon", "--home", str(home), *extra],
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    try:
        url = _ready_url(process, timeout)
    except BaseException:
        process.kill()
        process.wait()
        raise
    token = (home / "rpc.cookie").read_text().partition(":")[2]
    http = httpx.Client(headers={"Authorization": f"Bearer {token}"}, timeout=60)
    return Daemon(home, process, url, token, http)


def _ready_url(process: subprocess.Popen[str], timeout: float) -> str:
    deadline = time.monotonic() + timeout
    assert process.stdout is not None
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"the daemon did not report ready within {timeout} s")
        readable, _, _ = select.select([process.stdout], [], [], remaining)
        if not readable:
            continue
        line = process.stdout.readline()
        if not line:  # it exited
            process.wait()
            raise RuntimeError(f"the daemon exited with status {process.returncode} before it was ready")
        if line.startswith(READY):
            return line[len(READY) :].strip()


@contextmanager
def running(home: Path, *extra: str) -> Iterator[Daemon]:
    """A daemon for the duration of the block, stopped (and killed if need be) whatever happens."""
    daemon = start(home, *extra)
    try:
        yield daemon
    finally:
        daemon.stop()


def log_lines(home: Path) -> list[dict[str, Any]]:
    """The JSON log lines the daemons of a home wrote to stderr."""
    return [json.loads(line) for line in (home / LOG).read_text().splitlines() if line.startswith("{")]
