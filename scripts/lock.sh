#!/usr/bin/env bash
# Re-resolves the lock files from pyproject.toml's ranges (today's newest releases that fit) with every file's
# SHA-256. scripts/test.sh, scripts/demo.sh, docker/Dockerfile and CI install from them with
# `pip install --require-hashes`, so every machine runs the same versions; `pip install .` keeps the ranges.
#   requirements-dev.lock     the project's dependencies and its [dev] tools (scripts/test.sh, CI)
#   requirements.lock         the project's dependencies alone, at the versions of requirements-dev.lock (the image,
#                             scripts/demo.sh)
#   requirements-smollm.lock  the [smollm] extra's packages alone, installed with --no-deps (see pyproject.toml)
# Resolved for CPython 3.11 on Linux (CI's and the image's Python) by uv, which it installs into a temporary
# environment unless UV names one. Run it after changing a dependency in pyproject.toml, or to take new releases
# (`scripts/lock.sh --upgrade`; `--upgrade-package numpy` for one); then run scripts/test.sh and commit the files.
set -euo pipefail
cd "$(dirname "$0")/.."

UV_VERSION=0.13.10
uv=${UV:-}
if [ -z "$uv" ]; then
  tools=$(mktemp -d)
  trap 'rm -rf "$tools"' EXIT
  "${PYTHON:-python3}" -m venv "$tools"
  "$tools/bin/python" -m pip install --quiet --disable-pip-version-check "uv==$UV_VERSION"
  uv=$tools/bin/uv
fi

compile=("$uv" pip compile --quiet --python-version 3.11 --python-platform linux --generate-hashes
  --custom-compile-command scripts/lock.sh "$@")
"${compile[@]}" pyproject.toml --extra dev -o requirements-dev.lock
"${compile[@]}" pyproject.toml --constraint requirements-dev.lock -o requirements.lock
python3 -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["smollm"]))' |
  "${compile[@]}" --no-deps - -o requirements-smollm.lock
if grep -il '^torch' requirements*.lock; then
  echo "scripts/lock.sh: torch crept into the lock (above); the project must not depend on it" >&2
  exit 1
fi
