"""Print the JS peer's `publish` command for experiences of your own, each with the embedding the network's pinned
model gives its text (the JS peer cannot run the model, and every node checks the embedding). For running the
peer by hand (docs/INTEROP.md):

    PYTHONPATH=. .venv/bin/python tests/interop/publish_command.py ~/.expledger-devnet/network.json \
        "When a peer from another implementation joins, verify what it sends." > command.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ledger.embedder import embedder_for, pack_float16
from ledger.params import NetworkParams


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("genesis", type=Path, help="the network's network.json")
    parser.add_argument("texts", nargs="+", help="one experience per text")
    parser.add_argument("--domain", default="p2p.interop", help="dotted taxonomy path (default: p2p.interop)")
    parser.add_argument("--confidence", type=float, default=0.8)
    args = parser.parse_args()
    params = NetworkParams.from_file(args.genesis)
    vectors = embedder_for(params).embed(args.texts)
    contents = [
        {
            "text": text,
            "domain": args.domain.split("."),
            "confidence": args.confidence,
            "embedding": {
                "model": params.embedding_model,
                "dim": params.embedding_dim,
                "values": pack_float16(vector).hex(),
            },
        }
        for text, vector in zip(args.texts, vectors, strict=True)
    ]
    print(json.dumps({"cmd": "publish", "contents": contents}))


if __name__ == "__main__":
    main()
