#!/usr/bin/env bash
# The first command on a fresh clone: creates .venv if needed (as scripts/test.sh does), installs the
# project there at the locked versions (requirements.lock), then runs the demo devnet (`expledger devnet
# demo`): 3 nodes on 127.0.0.1, a seed library submitted through different nodes, a conflict and a
# near-duplicate, convergence, then retrieval and the context-injection prompt. The devnet keeps running;
# `.venv/bin/expledger devnet down --clean` removes it.
# Extra arguments go to `expledger devnet demo` (e.g. --nodes 5).
#
#   EXPLEDGER_DEVNET            the devnet's directory (default ~/.expledger-devnet)
#   EXPLEDGER_DEVNET_BASE_PORT  its first port (default 8700: node i uses BASE+2(i-1) for RPC, the next for p2p)
#   EXPLEDGER_DEMO_VENV         an existing virtual environment with the project's dependencies, used instead
#                               of creating .venv; the checkout's own code runs (PYTHONPATH). The tests use it
#                               to run this script from a fresh clone without a second install.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ -n "${EXPLEDGER_DEMO_VENV:-}" ]; then
  python="$EXPLEDGER_DEMO_VENV/bin/python"
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
else
  source scripts/venv.sh
  project_venv scripts/demo.sh requirements.lock "installing the project into .venv (about a minute the first time)"
  python=.venv/bin/python
fi

exec "$python" -m node.cli devnet demo "$@"
