"""Vector index benchmark: build, catch-up, verified restore, and exact search against usearch HNSW.

Usage: python -m bench.bench_index [--sizes 1000,5000,10000,20000,30000,50000,100000] [--queries 300]
                                   [--model hashing|default]

Baselines in the same run: usearch's parallel add (the index adds on one thread, so that a
build does not depend on scheduling), a bare usearch restore (the index checks a digest first),
and HNSW search against the index's exact search (which is also the ground truth for recall);
a plain BLAS float32 matrix product (multi-threaded) shows what the exact search gives up to
stay on one thread.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from usearch.index import Index

from bench.workload import OBJECTS, SUBJECTS, VERBS
from ledger.cid import CID
from ledger.embedder import HashingEmbedder, embedder_for, pack_float16
from ledger.index import EXACT_SEARCH_LIMIT, INDEX_FILE, ExperienceIndex, hnsw
from ledger.params import NetworkParams

WORDS = [w for phrase in SUBJECTS + OBJECTS for w in phrase.split()] + VERBS
CATCH_UP = 1000  # new experiences added to an index of each size
K = 5
ROUNDS = 3  # the query set is timed this many times; percentiles are the median over rounds (a shared machine)


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


def timed(action: Callable[[], object]) -> float:
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def median_of(runs: int, action: Callable[[], object]) -> float:
    return statistics.median(timed(action) for _ in range(runs))


def measure(size: int, corpus: np.ndarray, queries: np.ndarray, model: str, dim: int, path: Path) -> None:
    packed = [pack_float16(v) for v in corpus[: size + CATCH_UP]]
    ids = [CID.for_block(i.to_bytes(8, "big")).raw for i in range(size + CATCH_UP)]
    owner = "did:key:bench"
    stored = dict(zip(ids, packed, strict=True))  # version -> float16 vector: the ledger's stored embeddings

    def vectors(versions: list[bytes]) -> np.ndarray:
        return np.stack([np.frombuffer(stored[version], dtype="<f2").astype(np.float32) for version in versions])

    index = ExperienceIndex(path, model, dim, owner, vectors)
    build = timed(lambda: index.rebuild(zip(ids[:size], ids[:size], packed[:size], strict=True), size, 0))
    parallel = hnsw(dim)
    keys = np.arange(size, dtype=np.uint64)
    build_parallel = timed(lambda: parallel.add(keys, corpus[:size]))
    index.save()

    fresh = {ids[i]: (ids[i], packed[i]) for i in range(size, size + CATCH_UP)}
    catch_up = timed(lambda: index.update(fresh, []))
    new_keys = np.arange(size, size + CATCH_UP, dtype=np.uint64)
    catch_up_parallel = timed(lambda: parallel.add(new_keys, corpus[size : size + CATCH_UP]))

    file_bytes = (path / INDEX_FILE).read_bytes()
    restore = median_of(5, lambda: ExperienceIndex(path, model, dim, owner, vectors).load(0))
    bare = median_of(5, lambda: Index.restore(str(path / INDEX_FILE)))
    digest = median_of(5, lambda: hashlib.sha256((path / INDEX_FILE).read_bytes()).digest())

    searchers = {}
    for name, limit in (("hnsw", 0), ("exact", size)):
        searchers[name] = ExperienceIndex(path, model, dim, owner, vectors, exact_limit=limit)
        assert searchers[name].load(0) is None and len(searchers[name]) == size
    # its rows come with the key map up to twice the limit; above, it reads every stored vector first
    first_exact = timed(lambda: searchers["exact"].search(queries[0], K))
    matrix = corpus[:size].astype(np.float16).astype(np.float32)
    matrix /= np.linalg.norm(matrix, axis=1, keepdims=True)
    rounds: list[dict[str, list[float]]] = []
    recalls = []
    for _ in range(ROUNDS):
        times: dict[str, list[float]] = {"hnsw": [], "exact": [], "blas": []}
        for query in queries:
            found = {}
            for name, searcher in searchers.items():
                start = time.perf_counter()
                found[name] = {exp_id for exp_id, _ in searcher.search(query, K)}
                times[name].append(time.perf_counter() - start)
            times["blas"].append(timed(lambda q=query: np.argpartition(-(matrix @ q), K)[:K]))
            recalls.append(len(found["hnsw"] & found["exact"]) / K)
        rounds.append(times)

    def latency(name: str) -> str:
        p50, p99 = (statistics.median(percentile(r[name], p) for r in rounds) * 1e3 for p in (0.5, 0.99))
        return f"{p50:.2f}/{p99:.2f}"

    ratio = statistics.median(statistics.median(r["exact"]) / statistics.median(r["hnsw"]) for r in rounds)
    used = "exact" if size <= EXACT_SEARCH_LIMIT else "HNSW"
    print(
        f"  {size:>7,} experiences ({used} by default)\n"
        f"      build {build:6.2f} s on 1 thread, {build_parallel:6.2f} s parallel (x{build / build_parallel:.1f}); "
        f"adding {CATCH_UP:,} more {catch_up * 1e3:.0f} ms vs {catch_up_parallel * 1e3:.0f} ms "
        f"(x{catch_up / catch_up_parallel:.1f})\n"
        f"      restore {restore * 1e3:.1f} ms verified, bare usearch restore {bare * 1e3:.1f} ms, "
        f"of which digest {digest * 1e3:.1f} ms ({len(file_bytes) / 1e6:.1f} MB); first exact search "
        f"{first_exact * 1e3:.1f} ms (matrix {size * dim * 4 / 1e6:.0f} MB)\n"
        f"      HNSW p50/p99 {latency('hnsw')} ms, exact p50/p99 {latency('exact')} ms, "
        f"exact/HNSW p50 x{ratio:.1f}, HNSW recall@{K} {statistics.mean(recalls):.3f}; "
        f"BLAS matrix product p50/p99 {latency('blas')} ms",
        flush=True,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,5000,10000,20000,30000,50000,100000")
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--model", choices=["default", "hashing"], default="default")
    args = parser.parse_args(argv)
    params = NetworkParams()
    embedder = embedder_for(params) if args.model == "default" else HashingEmbedder(256)
    rng = random.Random(3)
    sizes = [int(s) for s in args.sizes.split(",")]
    total = max(sizes) + CATCH_UP
    print(f"embedding {total + args.queries:,} texts with {embedder.model_id} ...", file=sys.stderr, flush=True)
    corpus = embed_all(embedder, texts(total, rng))
    queries = embed_all(embedder, texts(args.queries, rng))
    print(f"model {embedder.model_id} ({embedder.dim}-d), {args.queries} queries, k={K}")
    sample = texts(5000, rng)
    for speed_embedder in (embedder_for(params), HashingEmbedder(256)):
        seconds = timed(lambda e=speed_embedder: embed_all(e, sample))
        print(f"  {speed_embedder.model_id}: {len(sample) / seconds:,.0f} embeddings/s")
    blob = np.random.default_rng(0).bytes(64_000_000)
    for name in ("sha256", "blake2b"):
        print(f"  {name}: {len(blob) / median_of(3, lambda n=name: hashlib.new(n, blob).digest()) / 1e6:,.0f} MB/s")
    print(f"  load average before: {os.getloadavg()[0]:.2f} (other processes make figures noisy)")
    for size in sizes:
        with tempfile.TemporaryDirectory() as tmp:
            measure(size, corpus, queries, embedder.model_id, embedder.dim, Path(tmp))
    print(f"  load average after: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
