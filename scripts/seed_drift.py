"""How far a seeded, sampled answer drifts when other sequences share its continuous batch.

    HF_HUB_OFFLINE=1 .venv/bin/python scripts/seed_drift.py --quantization none int4-cpu

models.yaml's first model in the continuous batching engine alone (no Serve). Each of `--requests`
seeded requests (temperature `--temperature`, seed i, `--max-tokens` tokens) is answered alone, then
again while `--others` unseeded sampled requests with other prompts run in the same batch. A seeded
row draws from its own generator, so the two answers can differ only where the model computed the
row's logits differently in the other batch (float32 on a CPU does not; bfloat16 and the int4
kernels round with the batch's shape). One JSON line per quantization: how many answers are
identical, and for those that are not, the token at which they part (median, min).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
from pathlib import Path

from deployments.config import EngineParams, load_models_file
from deployments.engines import create_text_engine
from deployments.protocol.replica import GenerateRequest, TextMessage

ROOT = Path(__file__).resolve().parents[1]
QUESTIONS = [
    "Tell me a short story about a cat.",
    "What should I cook tonight?",
    "Describe the sea in a few words.",
    "Give me three names for a dog.",
    "Why is the sky blue?",
]


def ask(text: str, **kw: object) -> GenerateRequest:
    return GenerateRequest(messages=[TextMessage(role="user", content=text)], **kw)  # type: ignore[arg-type]


async def tokens(engine: object, request: GenerateRequest) -> list[int]:
    stream = await engine.start(request)  # type: ignore[attr-defined]
    out: list[int] = []
    async for ids in stream.tokens:
        out += ids
    return out


async def measure(quantization: str, args: argparse.Namespace) -> dict[str, object]:
    entry = load_models_file(ROOT / "models.yaml").models[0]
    params = EngineParams.model_validate(
        {**entry.params.model_dump(exclude_unset=True), "quantization": quantization, "dtype": "auto"}
    )
    engine = create_text_engine(entry.model_copy(update={"params": params}))
    try:
        seeded = [
            ask(QUESTIONS[i % len(QUESTIONS)], temperature=args.temperature, seed=i, max_tokens=args.max_tokens)
            for i in range(args.requests)
        ]
        parted: list[int] = []
        for i, request in enumerate(seeded):
            alone = await tokens(engine, request)
            others = [
                ask(QUESTIONS[(i + k + 1) % len(QUESTIONS)] + " " * k, temperature=1.0, max_tokens=args.max_tokens)
                for k in range(args.others)
            ]
            together = (await asyncio.gather(*(tokens(engine, r) for r in [*others, request])))[-1]
            if together != alone:
                parted.append(
                    next((j for j, (a, b) in enumerate(zip(alone, together, strict=False)) if a != b), len(alone))
                )
        return {
            "quantization": quantization,
            "dtype": str(engine.model.dtype).removeprefix("torch."),
            "requests": args.requests,
            "identical": args.requests - len(parted),
            "parted_at_token_median": statistics.median(parted) if parted else None,
            "parted_at_token_min": min(parted) if parted else None,
            "max_tokens": args.max_tokens,
        }
    finally:
        engine.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quantization", nargs="+", default=["none", "int4-cpu"])
    parser.add_argument("--requests", type=int, default=20)
    parser.add_argument("--others", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--temperature", type=float, default=0.8)
    args = parser.parse_args()
    for quantization in args.quantization:
        print(json.dumps(asyncio.run(measure(quantization, args))), flush=True)


if __name__ == "__main__":
    main()
