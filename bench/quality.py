"""Retrieval quality you can rerun: hit@k, precision at the relevance threshold, paraphrase and negation cosines.

Usage: python -m bench.quality

Reads bench/quality_set.json (experiences in several domains, queries with their relevant
experiences, paraphrase pairs, negation pairs) and prints the figures for the network's default
embedder and for the feature-hashing embedder, so a threshold can be chosen by measurement.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from ledger.embedder import Embedder, HashingEmbedder, embedder_for
from ledger.params import NetworkParams

SET = Path(__file__).with_name("quality_set.json")


def _cosines(embedder: Embedder, pairs: list[list[str]]) -> list[float]:
    left = embedder.embed([a for a, _ in pairs])
    right = embedder.embed([b for _, b in pairs])
    return [float(x @ y) for x, y in zip(left, right, strict=True)]


def report(embedder: Embedder, data: dict, threshold: float) -> None:
    experiences = data["experiences"]
    ids = [e["id"] for e in experiences]
    matrix = embedder.embed([e["text"] for e in experiences])
    queries = embedder.embed([q["query"] for q in data["queries"]])
    scores = queries @ matrix.T
    hits = {1: 0, 3: 0, 5: 0}
    relevant_scores, irrelevant_scores = [], []
    served = served_relevant = 0
    for row, query in zip(scores, data["queries"], strict=True):
        ranking = [ids[i] for i in np.argsort(-row)]
        relevant = set(query["relevant"])
        for k in hits:
            hits[k] += bool(relevant & set(ranking[:k]))
        for exp_id, score in zip(ids, row.tolist(), strict=True):
            (relevant_scores if exp_id in relevant else irrelevant_scores).append(score)
            if score > threshold:
                served += 1
                served_relevant += exp_id in relevant
    count = len(data["queries"])
    texts = [e["text"] for e in experiences] * 50
    start = time.perf_counter()
    embedder.embed(texts)
    speed = len(texts) / (time.perf_counter() - start)
    paraphrases = _cosines(embedder, data["paraphrases"])
    negations = _cosines(embedder, data["negations"])
    print(
        f"{embedder.model_id} ({embedder.dim}-d), {len(experiences)} experiences, {count} queries, {speed:,.0f} texts/s"
    )
    print("  " + ", ".join(f"hit@{k} {hits[k] / count:.2f}" for k in hits))
    print(
        f"  at threshold {threshold}: {served} served, precision {served_relevant / max(served, 1):.2f}, "
        f"recall {served_relevant / len(relevant_scores):.2f}"
    )
    print(
        f"  query-experience cosine: relevant median {statistics.median(relevant_scores):.2f} "
        f"(max {max(relevant_scores):.2f}), irrelevant median {statistics.median(irrelevant_scores):.2f} "
        f"(max {max(irrelevant_scores):.2f})"
    )
    print(
        f"  paraphrase cosine min/median/max {min(paraphrases):.2f}/{statistics.median(paraphrases):.2f}/"
        f"{max(paraphrases):.2f}; negation pairs max {max(negations):.2f}"
    )


def main() -> int:
    data = json.loads(SET.read_text())
    params = NetworkParams()
    report(embedder_for(params), data, params.relevance_threshold)
    report(HashingEmbedder(256), data, NetworkParams(embedding_model="feature-hash-v1").relevance_threshold)
    return 0


if __name__ == "__main__":
    sys.exit(main())
