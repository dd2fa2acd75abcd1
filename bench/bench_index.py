"""Vector index benchmark: build time, query latency and recall@5 of usearch HNSW against exact search.

Usage: python -m bench.bench_index [--sizes 10000,100000] [--queries 300] [--model hashing|default]

The baseline in the same run is exact float32 search (a matrix product over every vector),
which is also the ground truth for recall.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.workload import OBJECTS, SUBJECTS, VERBS
from ledger.cid import CID
from ledger.embedder import HashingEmbedder, embedder_for, pack_float16
from ledger.index import ExperienceIndex
from ledger.params import NetworkParams

WORDS = [w for phrase in SUBJECTS + OBJECTS for w in phrase.split()] + VERBS


def texts(count: int, rng: random.Random) -> list[str]:
    """Experience-like sentences over a shared vocabulary, so neighbourhoods are realistic, not random."""
    return [
        f"When working on {rng.choice(SUBJECTS)}, {rng.choice(VERBS)} {rng.choice(OBJECTS)} "
        f"and {' '.join(rng.choices(WORDS, k=6))}."
        for _ in range(count)
    ]


def embed_all(embedder, items: list[str]) -> np.ndarray:
    rows = []
    for start in range(0, len(items), 256):
        rows.append(embedder.embed(items[start : start + 256]))
        if start % 20_000 == 0 and start:
            print(f"  embedded {start:,}/{len(items):,}", file=sys.stderr, flush=True)
    return np.vstack(rows)


def percentile(values: list[float], p: float) -> float:
    return sorted(values)[min(len(values) - 1, int(p * len(values)))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000,100000")
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--model", choices=["default", "hashing"], default="default")
    args = parser.parse_args(argv)
    params = NetworkParams()
    embedder = embedder_for(params) if args.model == "default" else HashingEmbedder(256)
    rng = random.Random(3)
    sizes = [int(s) for s in args.sizes.split(",")]
    print(f"embedding {max(sizes) + args.queries:,} texts with {embedder.model_id} ...", file=sys.stderr, flush=True)
    corpus = embed_all(embedder, texts(max(sizes), rng))
    queries = embed_all(embedder, texts(args.queries, rng))
    print(f"model {embedder.model_id} ({embedder.dim}-d), {args.queries} queries, k=5")
    sample = texts(5000, rng)
    for speed_embedder in (embedder_for(params), HashingEmbedder(256)):
        start = time.perf_counter()
        embed_all(speed_embedder, sample)
        print(f"  {speed_embedder.model_id}: {len(sample) / (time.perf_counter() - start):,.0f} embeddings/s")
    for size in sizes:
        vectors = corpus[:size]
        packed = [pack_float16(v) for v in vectors]
        ids = [CID.for_block(i.to_bytes(8, "big")).raw for i in range(size)]
        with tempfile.TemporaryDirectory() as tmp:
            index = ExperienceIndex(Path(tmp), embedder.model_id, embedder.dim)
            start = time.perf_counter()
            index.rebuild(zip(ids, ids, packed, strict=True), size, 0)
            build = time.perf_counter() - start
            index.save()
            start = time.perf_counter()
            restored = ExperienceIndex(Path(tmp), embedder.model_id, embedder.dim)
            assert restored.load(0) is None and len(restored) == size
            restore = time.perf_counter() - start
            exact_matrix = np.stack([np.frombuffer(p, dtype="<f2").astype(np.float32) for p in packed])
            exact_matrix /= np.linalg.norm(exact_matrix, axis=1, keepdims=True)
            hnsw_times, exact_times, recalls = [], [], []
            for query in queries:
                start = time.perf_counter()
                found = {exp_id for exp_id, _ in index.search(query, 5)}
                hnsw_times.append(time.perf_counter() - start)
                start = time.perf_counter()
                truth = np.argpartition(-(exact_matrix @ query), 5)[:5]
                exact_times.append(time.perf_counter() - start)
                recalls.append(len(found & {ids[i] for i in truth.tolist()}) / 5)
        print(
            f"  {size:>7,} experiences: build {build:6.1f} s, restore {restore * 1e3:.0f} ms, "
            f"HNSW p50/p99 {percentile(hnsw_times, 0.5) * 1e3:.2f}/{percentile(hnsw_times, 0.99) * 1e3:.2f} ms, "
            f"exact p50/p99 {percentile(exact_times, 0.5) * 1e3:.2f}/{percentile(exact_times, 0.99) * 1e3:.2f} ms, "
            f"speed-up x{statistics.median(exact_times) / statistics.median(hnsw_times):.1f}, "
            f"recall@5 {statistics.mean(recalls):.3f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
