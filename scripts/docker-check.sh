#!/usr/bin/env bash
# docker/ on a real container engine: builds the image and runs tests/test_docker_engine.py (two containers that
# peer and reach one state root). Not part of scripts/test.sh: a first build takes minutes (docs/DEVNET.md).
#
# The engine is Docker where `docker info` answers, else Podman, installed from Debian's packages when missing
# (root on Debian). Podman here needs three settings, written (as root) to /etc/containers/containers.conf.d/
# (each was an error on a Firecracker VM with cgroups v1 beside a v2 hierarchy and no CAP_SYS_RESOURCE):
#   runtime runc     crun 1.8: "cgroups in hybrid mode not supported, drop all controllers from cgroupv2"
#   nofile, nproc    at most this shell's hard limits (nproc at most 32768, Podman's own): "crun: setrlimit
#                    `RLIMIT_NOFILE`: Operation not permitted" with Podman's defaults
# The Dockerfile's base, python:3.11-slim-bookworm, comes from Docker Hub; where it cannot be pulled, a stand-in is
# made once with debootstrap: Debian bookworm with Python 3.11, its headers and pip, and no EXTERNALLY-MANAGED
# marker, as in the official image, trusting this machine's own CA certificates (/usr/local/share/ca-certificates)
# as the machine does, so that pip in the build reaches PyPI wherever the machine does.
#
#   EXPLEDGER_CONTAINER_ENGINE   podman or docker (default as above)
#   EXPLEDGER_BASE_IMAGE         the base to build on (default python:3.11-slim-bookworm, else the stand-in)
#   EXPLEDGER_DOCKER_CHECK_VENV  an existing virtual environment with the project's dev dependencies, used
#                                instead of making .venv (the checkout's own code runs, through PYTHONPATH)
# Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."

OFFICIAL_BASE=python:3.11-slim-bookworm
STAND_IN_BASE=localhost/expledger-base:bookworm

engine=${EXPLEDGER_CONTAINER_ENGINE:-}
if [ -z "$engine" ]; then
  if command -v docker >/dev/null && docker info >/dev/null 2>&1; then engine=docker; else engine=podman; fi
fi

if [ "$engine" = podman ] && ! command -v podman >/dev/null; then
  echo "installing podman and runc (Debian's packages)"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q podman runc debootstrap >/dev/null
fi

if [ "$engine" = podman ] && [ "$(id -u)" = 0 ]; then
  nproc_limit=$(ulimit -Hu)
  if [ "$nproc_limit" = unlimited ] || [ "$nproc_limit" -gt 32768 ]; then nproc_limit=32768; fi
  nofile_limit=$(ulimit -Hn)
  mkdir -p /etc/containers/containers.conf.d
  cat > /etc/containers/containers.conf.d/expledger.conf <<EOF
# written by scripts/docker-check.sh (experience-ledger): see its header
[containers]
default_ulimits = ["nofile=$nofile_limit:$nofile_limit", "nproc=$nproc_limit:$nproc_limit"]
[engine]
runtime = "runc"
EOF
fi
"$engine" info >/dev/null

rootfs=""
trap '[ -z "$rootfs" ] || rm -rf "$rootfs"' EXIT
stand_in_base() {
  echo "making $STAND_IN_BASE with debootstrap (a few minutes, once)"
  command -v debootstrap >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -q debootstrap >/dev/null
  rootfs=$(mktemp -d)
  debootstrap --variant=minbase --include=python3,python3-dev,python3-pip,python-is-python3,ca-certificates \
    bookworm "$rootfs" >/dev/null
  if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
    cp /usr/local/share/ca-certificates/*.crt "$rootfs/usr/local/share/ca-certificates/"
    chroot "$rootfs" update-ca-certificates >/dev/null
  fi
  rm -f "$rootfs"/usr/lib/python3*/EXTERNALLY-MANAGED
  chroot "$rootfs" apt-get clean
  rm -rf "$rootfs"/var/lib/apt/lists/*
  tar -C "$rootfs" -c . | "$engine" import --change 'CMD ["python3"]' - "$STAND_IN_BASE" >/dev/null
  rm -rf "$rootfs"
  rootfs=""
}

base=${EXPLEDGER_BASE_IMAGE:-}
if [ -z "$base" ]; then
  if "$engine" image inspect "$OFFICIAL_BASE" >/dev/null 2>&1 || "$engine" pull -q "$OFFICIAL_BASE" >/dev/null; then
    base=$OFFICIAL_BASE
  else
    echo "$OFFICIAL_BASE cannot be pulled here: building on $STAND_IN_BASE"
    "$engine" image inspect "$STAND_IN_BASE" >/dev/null 2>&1 || stand_in_base
    base=$STAND_IN_BASE
  fi
fi

if [ -n "${EXPLEDGER_DOCKER_CHECK_VENV:-}" ]; then
  python="$EXPLEDGER_DOCKER_CHECK_VENV/bin/python"
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
else
  source scripts/venv.sh
  project_venv scripts/docker-check.sh requirements-dev.lock "installing the project and its dev tools into .venv"
  python=.venv/bin/python
fi

export EXPLEDGER_ENGINE_TEST=1 EXPLEDGER_CONTAINER_ENGINE="$engine" EXPLEDGER_BASE_IMAGE="$base"
exec "$python" -m pytest -n 0 -v tests/test_docker_engine.py "$@"
