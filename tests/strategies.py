"""Hypothesis strategies: operations of every kind (shape only: validity is not required), and the horizons the
convergence properties run with."""

from hypothesis import strategies as st

from ledger.cid import CID
from ledger.ops import Embedding, Example, Experience, Kind, Operation
from tests import factories as f

#: causal horizons (§7.2) the property tests run with: with the smallest, most pairs of operations are ordered by
#: their clocks alone; with the network's default, none of these short histories reaches it
HORIZONS = st.sampled_from([1, 3, 8, f.PARAMS.causal_horizon])
#: absorption horizons (§7.6): with the small ones, copies a few clocks apart stay apart or join through chains,
#: and a late copy takes over only the copies of its window
ABSORPTION_HORIZONS = st.sampled_from([1, 2, 3, f.PARAMS.absorption_horizon])

cids = st.binary(min_size=1, max_size=16).map(CID.for_block)
sorted_cids = st.lists(cids, max_size=4, unique=True).map(lambda links: tuple(sorted(links)))
examples = st.builds(Example, st.text(max_size=20), st.text(max_size=20), st.booleans())
experiences = st.builds(
    Experience,
    text=st.text(max_size=60),
    domain=st.lists(st.text(max_size=8), max_size=3).map(tuple),
    confidence=st.floats(allow_nan=False, allow_infinity=False).filter(lambda x: str(x) != "-0.0"),  # refused
    embedding=st.builds(Embedding, st.text(max_size=10), st.integers(0, 2**32), st.binary(max_size=64)),
    examples=st.lists(examples, max_size=3).map(tuple),
    source=st.text(max_size=10),
)


@st.composite
def operations(draw: st.DrawFn) -> Operation:
    kind = draw(st.sampled_from(list(Kind)))
    fields: dict[str, object] = {}
    if kind in (Kind.ADD, Kind.MODIFY, Kind.MERGE):
        fields["content"] = draw(experiences)
    if kind in (Kind.MODIFY, Kind.DELETE, Kind.VOTE):
        fields["target"] = draw(cids)
    if kind is Kind.MERGE:
        fields["targets"] = draw(sorted_cids)
    if kind in (Kind.DELETE, Kind.MERGE):
        fields["reason"] = draw(st.text(max_size=30))
    if kind is Kind.VOTE:
        fields["vote"] = draw(st.integers(-(2**63), 2**63))
    return Operation(
        kind=kind,
        author=draw(st.text(max_size=60)),
        clock=draw(st.integers(0, 2**64 - 1)),
        parents=draw(sorted_cids),
        created=draw(st.integers(-(2**63), 2**63)),
        signature=draw(st.binary(min_size=64, max_size=64) | st.binary(max_size=80)),
        **fields,
    )
