"""Retrieval over the index: ranking, the filters, never a dead version, the prompt and coverage."""

import json
from pathlib import Path

import numpy as np
import pytest

from ledger.embedder import embedder_for, pack_float16
from ledger.ledger import Ledger
from ledger.ops import Block, Embedding, Experience, Kind
from ledger.params import NetworkParams
from ledger.retrieval import Retriever
from ledger.validation import count_tokens
from tests import factories as f

GEOMETRY_QUERY = "Which intersection points of a line and a circle lie on the segment AB?"
PARAMS = NetworkParams()  # the real default model with its calibrated thresholds
EMBEDDER = embedder_for(PARAMS)
#: experiences of other domains from the labelled quality set, beside the four seed ones
OTHERS = [
    e
    for e in json.loads((Path(__file__).parent.parent / "bench" / "quality_set.json").read_text())["experiences"]
    if not e["domain"].startswith("math")
][:12]


def content(text: str, domain: tuple[str, ...] = ("math",)) -> Experience:
    vector = pack_float16(EMBEDDER.embed([text])[0])
    return Experience(text, domain, 0.8, Embedding(EMBEDDER.model_id, EMBEDDER.dim, vector))


def add(text: str, domain: tuple[str, ...], key: int) -> Block:
    return f.signed(f.operation(Kind.ADD, content=content(text, domain)), f.author(key))


@pytest.fixture
def seeded(tmp_path):
    ledger = Ledger.open(tmp_path / "n", PARAMS)
    domains = [("math", "geometry"), ("math", "combinatorics"), ("math", "proof"), ("math", "algebra")]
    blocks = [add(text, domain, i + 1) for i, (text, domain) in enumerate(zip(f.SEED_TEXTS, domains, strict=True))]
    others = [add(e["text"], tuple(e["domain"].split(".")), 10 + i) for i, e in enumerate(OTHERS)]
    outcomes = ledger.ingest([b.data for b in blocks + others])
    assert {o.outcome for o in outcomes} == {"applied"}
    yield ledger, blocks
    ledger.close()


def test_a_geometry_query_retrieves_the_geometry_experience_first(seeded):
    ledger, blocks = seeded
    hits = Retriever(ledger).retrieve(GEOMETRY_QUERY)
    assert hits[0].id == blocks[0].cid
    assert hits[0].domain == "math.geometry" and hits[0].text == f.SEED_TEXTS[0]
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)


def test_threshold_and_k_limit_results(seeded):
    ledger, _ = seeded
    retriever = Retriever(ledger)
    assert len(retriever.retrieve(GEOMETRY_QUERY, k=2)) <= 2
    assert retriever.retrieve(GEOMETRY_QUERY, threshold=0.99) == []


def test_domain_filter(seeded):
    ledger, blocks = seeded
    hits = Retriever(ledger).retrieve("separate real and imaginary parts of a polynomial", domain_prefix="math.algebra")
    assert [h.id for h in hits] == [blocks[3].cid]
    assert Retriever(ledger).retrieve(GEOMETRY_QUERY, domain_prefix="biology") == []


def test_deleted_merged_and_superseded_versions_are_never_returned(seeded):
    ledger, blocks = seeded
    geometry, combinatorics, proof, _ = blocks
    new_text = "When intersecting lines with segments, check each solution lies on the segment, not its extension."
    modify = f.signed(
        f.operation(
            Kind.MODIFY,
            clock=2,
            parents=[geometry.cid],
            target=geometry.cid,
            content=content(new_text, ("math", "geometry")),
        ),
        f.author(5),
    )
    delete = f.signed(f.operation(Kind.DELETE, clock=2, parents=[proof.cid], target=proof.cid, reason="wrong"))
    merge = f.signed(
        f.operation(
            Kind.MERGE,
            clock=3,
            parents=[combinatorics.cid, modify.cid],
            targets=tuple(sorted((combinatorics.cid, geometry.cid))),
            content=content(f.SEED_TEXTS[1]),
            reason="same",
        )
    )
    retriever = Retriever(ledger)
    assert {o.outcome for o in ledger.ingest([modify.data, delete.data])} == {"applied"}
    texts = [h.text for h in retriever.retrieve(GEOMETRY_QUERY, k=10, threshold=0.0)]
    assert new_text in texts and f.SEED_TEXTS[0] not in texts and f.SEED_TEXTS[2] not in texts
    assert ledger.submit(merge.data).outcome == "applied"
    ids = {h.id for h in retriever.retrieve(GEOMETRY_QUERY, k=10, threshold=0.0)}
    assert merge.cid in ids and not ids & {geometry.cid, combinatorics.cid, proof.cid}


def _add_with_embedding(text: str, values: bytes, key: int) -> Block:
    experience = Experience(text, ("math",), 0.5, Embedding(EMBEDDER.model_id, EMBEDDER.dim, values))
    return f.signed(f.operation(Kind.ADD, content=experience), f.author(key))


def test_forged_embeddings_are_void_on_every_node(tmp_path):
    honest = add(f.SEED_TEXTS[2], ("math",), 1)
    someone_elses = _add_with_embedding(f.SEED_TEXTS[0], content(f.SEED_TEXTS[3]).embedding.values, 7)
    rng = np.random.default_rng(1)
    random_vector = _add_with_embedding(
        f.SEED_TEXTS[1], pack_float16(rng.standard_normal(EMBEDDER.dim).astype(np.float32)), 8
    )
    nudged = np.frombuffer(content(f.SEED_TEXTS[1]).embedding.values, dtype="<f2").astype(np.float32)
    nudged[:8] += 0.01  # a small push towards other prompts
    pushed = _add_with_embedding(f.SEED_TEXTS[1], pack_float16(nudged), 9)
    for name in ("a", "b"):
        node = Ledger.open(tmp_path / name, PARAMS)
        outcomes = node.ingest([honest.data, someone_elses.data, random_vector.data, pushed.data])
        assert [o.outcome for o in outcomes] == ["applied", "invalid", "invalid", "invalid"]
        assert {o.errors[0].code for o in outcomes[1:]} == {"embedding.inconsistent"}
        assert node.view().live_ids() == [honest.cid] and set(node.indexed()) == {honest.cid.raw}
        node.close()


def test_context_follows_the_seed_template(seeded):
    ledger, _ = seeded
    prompt = Retriever(ledger).context(GEOMETRY_QUERY, k=2, threshold=0.0)
    head, problem = prompt.split("\n\n---\n\n")
    assert head.startswith("# Learned Experiences\n\n1. ")
    assert "\n\n2. " in head
    assert problem == f"# Problem\n\n{GEOMETRY_QUERY}"


def test_context_fits_the_token_budget(seeded):
    ledger, _ = seeded
    retriever = Retriever(ledger)
    full = retriever.context(GEOMETRY_QUERY, k=4, threshold=0.0)
    assert full.count("\n\n4. ") == 1
    best_only = retriever.context(GEOMETRY_QUERY, k=1, threshold=0.0)
    budget = count_tokens(best_only)
    assert retriever.context(GEOMETRY_QUERY, k=4, threshold=0.0, budget=budget) == best_only
    assert retriever.context(GEOMETRY_QUERY, k=4, threshold=0.0, budget=budget - 1) == f"# Problem\n\n{GEOMETRY_QUERY}"
    assert retriever.context(GEOMETRY_QUERY, threshold=0.99) == f"# Problem\n\n{GEOMETRY_QUERY}"


def test_coverage_counts_queries_with_a_relevant_experience(seeded):
    ledger, _ = seeded
    retriever = Retriever(ledger)
    queries = [GEOMETRY_QUERY, "?!"]  # the second embeds to nothing: no experience covers it
    assert retriever.coverage(queries) == 0.5
    assert retriever.coverage(queries, tau=0.999) == 0.0
    assert retriever.coverage([]) == 0.0
