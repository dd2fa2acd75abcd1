#!/bin/sh
# The image's entrypoint: make the node's home on the first start (`expledger init` is idempotent: later
# starts check the home and change nothing), join the bootstrap node when one is named, then replace
# itself with the daemon, which runs in the foreground and stops gracefully on SIGTERM (`docker stop`).
#
#   EXPLEDGER_HOME             the home (default /data, the image's volume)
#   EXPLEDGER_LISTEN           the address RPC and libp2p listen on (default 0.0.0.0: the container's network)
#   EXPLEDGER_RPC_PORT         RPC port (default 8645); EXPLEDGER_P2P_PORT libp2p port (default 4645)
#   EXPLEDGER_PUBLISH_ID       a file to write this node's peer id to (the bootstrap node, on a shared volume)
#   EXPLEDGER_BOOTSTRAP_HOST   the bootstrap node's host name (the other nodes), whose peer id they read from
#   EXPLEDGER_BOOTSTRAP_ID     that file (default /shared/bootstrap.id), and whose libp2p port is
#   EXPLEDGER_BOOTSTRAP_PORT   (default 4645)
set -eu

home="${EXPLEDGER_HOME:-/data}"
listen="${EXPLEDGER_LISTEN:-0.0.0.0}"
rpc="$listen:${EXPLEDGER_RPC_PORT:-8645}"
p2p="/ip4/$listen/tcp/${EXPLEDGER_P2P_PORT:-4645}"

if [ -n "${EXPLEDGER_BOOTSTRAP_HOST:-}" ]; then
    id_file="${EXPLEDGER_BOOTSTRAP_ID:-/shared/bootstrap.id}"
    waited=0
    # compose starts this node once the bootstrap node is healthy, so the file is normally there already
    until [ -s "$id_file" ]; do
        if [ "$waited" -ge 120 ]; then
            echo "expledger-entrypoint: no peer id in $id_file after 120 s; is the bootstrap node running?" >&2
            exit 2
        fi
        sleep 1
        waited=$((waited + 1))
    done
    # libp2p dials IP addresses: resolve the host name at every start (the bootstrap's address may change)
    address=$(python -c 'import socket, sys; print(socket.gethostbyname(sys.argv[1]))' "$EXPLEDGER_BOOTSTRAP_HOST")
    expledger devnet join --home "$home" --rpc "$rpc" --p2p "$p2p" --no-start \
        --bootstrap "/ip4/$address/tcp/${EXPLEDGER_BOOTSTRAP_PORT:-4645}/p2p/$(cat "$id_file")"
else
    expledger init --home "$home" --rpc "$rpc" --p2p "$p2p"
fi

if [ -n "${EXPLEDGER_PUBLISH_ID:-}" ]; then
    expledger id --home "$home" --json \
        | python -c 'import json, sys; print(json.load(sys.stdin)["peer_id"])' > "$EXPLEDGER_PUBLISH_ID.tmp"
    mv "$EXPLEDGER_PUBLISH_ID.tmp" "$EXPLEDGER_PUBLISH_ID"
fi

exec expledger daemon --home "$home"
