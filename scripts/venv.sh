# Sourced by scripts/test.sh and scripts/demo.sh: make .venv (Python 3.11 or newer) if it is missing, and install
# into it the locked dependencies (the versions and SHA-256 digests in LOCK_FILE, made by scripts/lock.sh: every
# machine runs the same releases), then the project itself without resolving anything again. The install is
# skipped when LOCK_FILE and pyproject.toml are those of the last install into this .venv (a stamp in .venv holds
# their digest): checking an unchanged venv took ~7 s of every run. Remove the stamp, or .venv, to install again.
# Usage: project_venv SCRIPT_NAME LOCK_FILE MESSAGE [NO_DEPS_LOCK_FILE]
# (NO_DEPS_LOCK_FILE: more locked packages, installed without their dependencies, as the [smollm] extra's must be)
# (e.g. project_venv scripts/test.sh requirements-dev.lock "installing the project and its dev tools into .venv").
project_venv() {
  local script=$1 lock=$2 message=$3 no_deps_lock=${4:-}
  local python=${PYTHON:-python3}
  if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
    echo "$script: Python 3.11 or newer is required ($("$python" --version 2>&1) found); set PYTHON=" >&2
    exit 2
  fi
  if [ ! -x .venv/bin/python ]; then
    echo "creating .venv"
    "$python" -m venv .venv
  fi
  local stamp=".venv/.installed-$(basename "$lock")${no_deps_lock:+-$(basename "$no_deps_lock")}" digest
  digest=$(cat "$lock" $no_deps_lock pyproject.toml | sha256sum)
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$digest" ]; then
    return
  fi
  echo "$message"
  local pip=(.venv/bin/python -m pip install --quiet --disable-pip-version-check)
  "${pip[@]}" --upgrade pip
  "${pip[@]}" --require-hashes -r "$lock"
  "${pip[@]}" --no-deps -e .
  if [ -n "$no_deps_lock" ]; then
    "${pip[@]}" --no-deps --require-hashes -r "$no_deps_lock"
  fi
  echo "$digest" >"$stamp"
}
