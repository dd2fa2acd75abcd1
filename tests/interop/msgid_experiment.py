"""What a message-id mismatch between py-libp2p and js-libp2p gossipsub costs (docs/INTEROP.md).

Three daemons in a star and the JS peer dialling all three with a mesh of one peer, so that gossip (IHAVE/IWANT)
runs between it and the other two. The nodes publish `--rate` adds a second in turn for `--seconds`. Printed:
the messages the JS peer sent again because a node asked for them by IWANT (from its gossipsub debug log), how
many operations reached it, and the lowest gossipsub v1.1 score it gave a node. Run once per id function:

    PYTHONPATH=. .venv/bin/python tests/interop/msgid_experiment.py --msg-id spec
    PYTHONPATH=. .venv/bin/python tests/interop/msgid_experiment.py --msg-id js-default
"""

from __future__ import annotations

import argparse
import json
import os
import re
import tempfile
import time
from pathlib import Path

from tests.test_interop_js import INTEROP, js_peer, start_star
from tests.test_network import add, addr, network, peer_id

SETTLE = 5.0  # seconds after the last publish for gossip to finish
RESENT = re.compile(r"IWANT: Sending (\d+) messages to")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--msg-id", choices=["spec", "js-default"], required=True)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--rate", type=float, default=3.0, help="adds a second, from the three nodes in turn")
    args = parser.parse_args()
    os.environ["DEBUG"] = "libp2p:gossipsub"  # the JS peer inherits it: its gossipsub logs to stderr
    with tempfile.TemporaryDirectory() as root, network(Path(root)) as net:
        nodes = start_star(net, ["n1", "n2", "n3"])
        names = {peer_id(node): node.home.name for node in nodes}
        flags = ("--msg-id", args.msg_id, "--mesh-degree", "1")
        with js_peer(INTEROP, "devnet", [addr(node) for node in nodes], Path(root), *flags) as js:
            js.wait_for(lambda event: event["event"] == "peers" and len(event["subscribers"]) == 3, "3 subscribers")
            published, started, sampled = 0, time.monotonic(), 0.0
            while (now := time.monotonic()) - started < args.seconds:
                add(nodes[published % 3], f"When comparing message ids, check batch {word(published)} twice.")
                published += 1
                if now - sampled >= 1.0:
                    js.send({"cmd": "peers"})
                    sampled = now
                time.sleep(1 / args.rate)
            time.sleep(SETTLE)
            events = js.drain()
            resent = sum(int(n) for n in RESENT.findall((Path(root) / "js-peer.stderr").read_text()))
    lowest = {name: 0.0 for name in names.values()}
    for event in events:
        for connection in event["connections"] if event["event"] == "peers" else []:
            lowest[names[connection["peer"]]] = min(lowest[names[connection["peer"]]], connection["score"])
    received = len({event["cid"] for event in events if event["event"] == "operation"})
    print(json.dumps({"msg_id": args.msg_id, "published": published, "received": received, "resent": resent}))
    print(json.dumps({"lowest_score": lowest}))


def word(serial: int) -> str:
    """A letters-only word per serial number (digits would fail the generality rule)."""
    letters = ""
    while True:
        serial, digit = divmod(serial, 26)
        letters += chr(ord("a") + digit)
        if not serial:
            return "number" + letters


if __name__ == "__main__":
    main()
