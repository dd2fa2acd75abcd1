"""Write tests/vectors/inputs.json: signed operations of every kind for the reference codec to encode.

Run once at development time: `python -m tests.vectors.make_inputs`, then
`cd tests/vectors/reference && npm ci && node generate.mjs ../inputs.json ../vectors.json`.
"""

from __future__ import annotations

import json
from pathlib import Path

from ledger.ops import Example, Kind
from tests import factories as f
from tests.vectors.markers import to_marked

HERE = Path(__file__).parent


def build() -> list[tuple[str, object]]:
    alice, bob = f.author(1), f.author(2)
    g0 = f.add(
        f.SEED_TEXTS[0],
        alice,
        examples=(
            Example("Find intersection of line AB...", "Point P lies outside segment AB...", False),
            Example("Find intersection within triangle...", "Point Q is at (3,4) inside ABC.", True),
        ),
        source="training_run_42",
    )
    g1 = f.add(f.SEED_TEXTS[1], bob, domain=("math", "combinatorics"), confidence=1.0)
    g2 = f.add(f.SEED_TEXTS[2], alice, domain=("math", "proof"), confidence=0.5)
    g3 = f.add(f.SEED_TEXTS[3], bob, domain=("math", "algebra", "complex_numbers"), confidence=0.0)
    unicode = f.add(
        "When a problem mixes scripts like Ünïcødé, 数学 or Ελληνικά, normalise the text before comparing ✓ symbols.",
        alice,
        domain=("text", "unicode"),
        confidence=0.25,
    )
    parents = (g0.cid, g1.cid)
    modify = f.signed(
        f.operation(
            Kind.MODIFY,
            clock=2,
            parents=(g0.cid,),
            target=g0.cid,
            content=f.content(
                "When intersecting lines with segments, check that each solution lies on the bounded segment.",
                confidence=0.9,
            ),
        ),
        bob,
    )
    delete = f.signed(
        f.operation(
            Kind.DELETE, clock=3, parents=(modify.cid,), target=g2.cid, reason="Proven incorrect in evaluation"
        ),
        alice,
    )
    merge = f.signed(
        f.operation(
            Kind.MERGE,
            clock=2,
            parents=parents,
            targets=tuple(sorted(parents)),
            content=f.content(f.SEED_TEXTS[1], domain=("math",), confidence=0.75),
            reason="Both addressed same pattern",
        ),
        alice,
    )
    merge3 = f.signed(
        f.operation(
            Kind.MERGE,
            clock=4,
            parents=(g3.cid, unicode.cid),
            targets=tuple(sorted((g1.cid, g2.cid, g3.cid))),
            content=f.content(f.SEED_TEXTS[3], domain=("math", "algebra"), confidence=1.0),
            reason="Three near-duplicates — one insight",
        ),
        bob,
    )
    upvote = f.signed(f.operation(Kind.VOTE, clock=5, parents=(merge.cid,), target=g0.cid, vote=1), bob)
    downvote = f.signed(f.operation(Kind.VOTE, clock=5, parents=(merge.cid,), target=g1.cid, vote=-1), alice)
    blocks = {
        "add-seed-g0-examples": g0,
        "add-confidence-1.0-no-examples": g1,
        "add-confidence-0.5": g2,
        "add-confidence-0.0-deep-domain": g3,
        "add-unicode": unicode,
        "modify": modify,
        "delete": delete,
        "merge-two": merge,
        "merge-three-unicode-reason": merge3,
        "vote-up": upvote,
        "vote-down": downvote,
    }
    return [(name, block.op) for name, block in blocks.items()]


def main() -> None:
    entries = [
        {"name": name, "unsigned": to_marked(op.record(signed=False)), "signed": to_marked(op.record())}
        for name, op in build()
    ]
    (HERE / "inputs.json").write_text(json.dumps(entries, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {len(entries)} inputs")


if __name__ == "__main__":
    main()
