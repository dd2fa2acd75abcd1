#!/usr/bin/env python3
"""The image's HEALTHCHECK: healthy while the node's `GET /health` answers 200 (it needs no token; a
stopping node answers 503). The port is the entrypoint's: EXPLEDGER_RPC_PORT, default 8645."""

import os
import sys
import urllib.request

PORT = os.environ.get("EXPLEDGER_RPC_PORT", "8645")

try:
    with urllib.request.urlopen(f"http://127.0.0.1:{PORT}/health", timeout=4) as response:
        sys.exit(0 if response.status == 200 else 1)
except OSError as exc:  # refused, timed out, or an HTTP error status such as 503
    print(f"unhealthy: {exc}", file=sys.stderr)
    sys.exit(1)
