"""Hostile input to the ledger's public API: only the project's own errors come out, and a rejected
input leaves the store exactly as it was (every LevelDB key, the log, the state root)."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ledger.errors import LedgerError
from ledger.jsonview import experience_from_json
from ledger.ops import Kind
from tests import factories as f
from tests.ledgers import open_ledger, random_history

HISTORY = random_history(random.Random(21), 40)
VALID = [block.data for block in HISTORY]
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def ledger(tmp_path_factory):
    node = open_ledger(tmp_path_factory.mktemp("fuzz") / "node")
    node.ingest(VALID)
    yield node
    node.close()


def _state(ledger) -> tuple:
    return tuple(ledger.store.scan(b"")), ledger.view().log_size, ledger.view().state_root()


def _mutated(draw: st.DrawFn) -> bytes:
    """A valid operation with bytes flipped, cut, inserted or appended: nearly valid is the hard case."""
    data = bytearray(draw(st.sampled_from(VALID)))
    for _ in range(draw(st.integers(1, 4))):
        position = draw(st.integers(0, len(data) - 1))
        action = draw(st.sampled_from(["flip", "cut", "insert", "append"]))
        if action == "flip":
            data[position] ^= draw(st.integers(1, 255))
        elif action == "cut":
            del data[position:]
            if not data:
                break
        elif action == "insert":
            data[position:position] = draw(st.binary(min_size=1, max_size=8))
        else:
            data += draw(st.binary(min_size=1, max_size=8))
    return bytes(data)


items = st.one_of(st.binary(max_size=300), st.composite(lambda draw: _mutated(draw))())
#: text including lone surrogates (what json.loads makes of "\ud800"), format and space characters
texts = st.text(st.characters(categories=["Cs", "Cf", "Zs", "Ll", "Lu", "Po", "Nd"]), max_size=40)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | texts,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4),
    max_leaves=12,
)
#: experience views that are close to valid: the right keys with arbitrary values mixed in
views = st.fixed_dictionaries(
    {
        "text": st.one_of(st.just(f.SEED_TEXTS[1]), st.builds("When {}, check.".format, texts), json_values),
        "domain": st.one_of(st.just("math.geometry"), st.text(max_size=20), json_values),
        "confidence": st.one_of(st.just(0.5), st.floats(), json_values),
    },
    optional={"examples": json_values, "metadata": json_values, "embedding": json_values},
)


@FUZZ
@given(batch=st.lists(items, min_size=1, max_size=6))
def test_arbitrary_and_mutated_bytes(ledger, batch):
    before = _state(ledger)
    outcomes = ledger.ingest(batch)
    assert len(outcomes) == len(batch)
    if all(outcome.outcome in ("invalid", "duplicate") for outcome in outcomes):
        assert _state(ledger) == before
    for outcome in outcomes:
        assert outcome.outcome != "invalid" or outcome.errors


@FUZZ
@given(view=st.one_of(views, json_values))
def test_arbitrary_json_views(ledger, view):
    before = _state(ledger)
    try:
        content = experience_from_json(view, f.EMBEDDER)
        block = f.signed(f.operation(Kind.ADD, clock=1, content=content), f.author(7))
    except LedgerError:
        assert _state(ledger) == before
        return
    (outcome,) = ledger.ingest([block.data])
    if outcome.outcome == "invalid":
        assert outcome.errors and _state(ledger) == before


@FUZZ
@given(batch=st.lists(st.one_of(st.none(), st.integers(), st.text(max_size=5), st.binary(max_size=5)), max_size=4))
def test_items_of_the_wrong_type_are_invalid_outcomes(ledger, batch):
    before = _state(ledger)
    outcomes = ledger.ingest(batch)
    assert [o.outcome for o in outcomes] == ["invalid"] * len(batch)
    assert _state(ledger) == before


@pytest.mark.parametrize("argument", [b"\xa0", "a0", None, 5, bytearray(b"\xa0")])
def test_an_argument_that_is_not_a_batch_is_refused(ledger, argument):
    before = _state(ledger)
    with pytest.raises(LedgerError) as caught:
        ledger.ingest(argument)
    assert caught.value.code == "ingest.argument"
    assert _state(ledger) == before


def test_a_claimed_cid_list_of_the_wrong_shape_is_refused(ledger):
    with pytest.raises(LedgerError, match="expected"):
        ledger.ingest([VALID[0]], [HISTORY[0].cid, HISTORY[1].cid])
    with pytest.raises(LedgerError, match=r"expected\[0\]"):
        ledger.ingest([VALID[0]], ["bafy"])


def test_a_text_that_is_not_utf8_is_refused_when_encoded():
    content = replace(f.content(), text="When a surrogate \ud800 appears, check the bounds.")
    with pytest.raises(LedgerError) as caught:
        f.signed(f.operation(Kind.ADD, content=content))
    assert caught.value.code == "codec.utf8"
