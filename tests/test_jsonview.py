"""The JSON view of the first format seed, and JSON → operation → JSON for what a user supplies."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ledger.jsonview import JsonViewError, experience_from_json, experience_json, loads, operation_json
from ledger.ops import Kind, Operation
from tests import factories as f

SEED_VIEW = {
    "id": "exp_sha256_abc123...",
    "version": "1.0",
    "domain": "math.geometry",
    "text": f.SEED_TEXTS[0],
    "confidence": 0.87,
    "examples": [
        {"input": "Find intersection of line AB...", "output": "Point P lies outside segment AB...", "correct": False},
        {"input": "Find intersection within triangle...", "output": "Point Q is at (3,4) inside ABC.", "correct": True},
    ],
    "metadata": {
        "created_at": "2025-09-15T14:30:00Z",
        "created_by": "0x742d35Cc6634C0532925a...",
        "votes": {"upvotes": 24, "downvotes": 2},
        "usage_count": 156,
        "domains_applied": ["geometry", "optimization"],
    },
    "embedding": [0.123, -0.456],
    "merkle_proof": "0xdef456...",
}
USER_FIELDS = ("text", "domain", "confidence", "examples")


def _round_trip(view: dict) -> dict:
    block = f.signed(f.operation(Kind.ADD, content=experience_from_json(view, f.EMBEDDER)))
    return experience_json(block.cid, block.op)


def test_the_seed_example_round_trips_its_user_fields():
    out = _round_trip(SEED_VIEW)
    assert {k: out[k] for k in USER_FIELDS} == {k: SEED_VIEW[k] for k in USER_FIELDS}
    assert set(out) == set(SEED_VIEW)
    assert set(out["metadata"]) >= set(SEED_VIEW["metadata"])
    assert out["id"].startswith("bafyrei")
    assert out["metadata"]["created_at"] == "2024-09-15T14:30:00Z"
    assert out["metadata"]["created_by"] == f.author(1).did
    assert out["embedding"]["model"] == f.PARAMS.embedding_model
    assert len(out["embedding"]["values"]) == f.PARAMS.embedding_dim


def test_a_view_feeds_back_into_an_identical_operation():
    out = _round_trip(SEED_VIEW)
    assert _round_trip(out) == out


@given(
    text=st.text(min_size=1, max_size=80),
    domain=st.lists(st.from_regex(r"[a-z][a-z0-9_]{0,6}", fullmatch=True), min_size=1, max_size=4),
    confidence=st.floats(0, 1),
    examples=st.lists(
        st.fixed_dictionaries(
            {"input": st.text(max_size=20), "output": st.text(max_size=20), "correct": st.booleans()}
        ),
        max_size=3,
    ),
    source=st.text(max_size=20),
)
def test_user_fields_round_trip(text, domain, confidence, examples, source):
    view = {"text": text, "domain": ".".join(domain), "confidence": confidence, "examples": examples}
    view["metadata"] = {"source": source}
    out = _round_trip(view)
    assert {k: out[k] for k in USER_FIELDS} == {k: view[k] for k in USER_FIELDS}
    assert out["metadata"]["source"] == source


def test_domain_may_be_given_as_a_list():
    view = dict(SEED_VIEW, domain=["math", "geometry"])
    assert experience_from_json(view, f.EMBEDDER).domain == ("math", "geometry")


@pytest.mark.parametrize(
    ("view", "code", "field"),
    [
        ([], "json.type", "experience"),
        ({"domain": "math", "confidence": 0.5}, "json.missing", "text"),
        (dict(SEED_VIEW, confidence="high"), "json.type", "confidence"),
        (dict(SEED_VIEW, confidence=True), "json.type", "confidence"),
        (dict(SEED_VIEW, confidence=float("nan")), "json.type", "confidence"),
        (dict(SEED_VIEW, domain=["math", 3]), "json.type", "domain"),
        (dict(SEED_VIEW, colour="red"), "json.unknown_field", "colour"),
        (dict(SEED_VIEW, examples=[{"input": "a", "output": "b"}]), "json.missing", "examples[0].correct"),
        (dict(SEED_VIEW, examples=["a"]), "json.type", "examples[0]"),
        (dict(SEED_VIEW, metadata={"author": "me"}), "json.unknown_field", "metadata.author"),
        (dict(SEED_VIEW, metadata={"source": 5}), "json.type", "metadata.source"),
        (dict(SEED_VIEW, confidence=10**400), "json.type", "confidence"),
        (dict(SEED_VIEW, examples=None), "json.type", "examples"),
        (dict(SEED_VIEW, examples=5), "json.type", "examples"),
    ],
)
def test_bad_views_give_a_code_and_name_the_field(view, code, field):
    with pytest.raises(JsonViewError) as caught:
        experience_from_json(view, f.EMBEDDER)
    assert caught.value.code == code
    assert caught.value.message.startswith(field)


def test_operation_view_shows_every_field():
    target = f.add().cid
    vote = f.signed(f.operation(Kind.VOTE, clock=3, parents=(target,), target=target, vote=-1))
    view = operation_json(vote)
    assert view["cid"] == str(vote.cid)
    assert (view["kind"], view["clock"], view["vote"], view["target"]) == ("vote", 3, -1, str(target))
    assert view["parents"] == [str(target)]
    assert bytes.fromhex(view["signature"]) == vote.op.signature


def test_only_experience_operations_have_an_experience_view():
    delete = f.signed(Operation(Kind.DELETE, "", 1, (), 0, target=f.add().cid, reason="r"))
    with pytest.raises(ValueError):
        experience_json(delete.cid, delete.op)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"text": "When a\ud800, b."}, "text"),
        ({"domain": "math.\udc80"}, "domain"),
        ({"domain": ["math", "geo\udfff"]}, "domain[1]"),
        ({"examples": [{"input": "\ud83d", "output": "b", "correct": True}]}, "examples[0].input"),
        ({"metadata": {"source": "run\udcff"}}, "metadata.source"),
    ],
)
def test_a_lone_surrogate_is_refused_naming_the_field(change, field):
    """JSON escapes can spell a lone surrogate ("\\ud800"); no operation can carry one (it has no UTF-8 form)."""
    with pytest.raises(JsonViewError) as caught:
        experience_from_json(dict(SEED_VIEW, **change), f.EMBEDDER)
    assert caught.value.code == "json.utf8"
    assert caught.value.message.startswith(f"{field}: holds a lone surrogate U+")


def test_a_surrogate_from_parsed_json_is_refused():
    view = loads('{"text": "When a\\ud800, b.", "domain": "math", "confidence": 0.5}', "view.json")
    with pytest.raises(JsonViewError) as caught:
        experience_from_json(view, f.EMBEDDER)
    assert (caught.value.code, caught.value.message[:5]) == ("json.utf8", "text:")


def test_a_surrogate_pair_is_ordinary_text():
    view = loads('{"text": "When a \\ud83d\\ude00 appears, smile.", "domain": "math", "confidence": 0.5}', "view")
    assert experience_from_json(view, f.EMBEDDER).text == "When a \U0001f600 appears, smile."


@pytest.mark.parametrize(
    ("text", "code", "needle"),
    [
        ('{"text": "a", "text": "b"}', "json.duplicate_key", "'text' appears twice"),
        ('{"examples": [{"correct": true, "correct": false}]}', "json.duplicate_key", "'correct' appears twice"),
        ("{", "json.syntax", "not JSON"),
        (b"\xff{}", "json.syntax", "not JSON"),
        ("[" * 100_000, "json.syntax", "not JSON"),
    ],
)
def test_loads_refuses_what_json_leaves_ambiguous_or_broken(text, code, needle):
    with pytest.raises(JsonViewError) as caught:
        loads(text, "--json view.json")
    assert caught.value.code == code
    assert caught.value.message.startswith("--json view.json: ") and needle in caught.value.message
