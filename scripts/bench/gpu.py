"""The transformers engine on a GPU, side by side in one run with plain `model.generate` and the card's
memory-bandwidth roofline, on a random-weight model of a real shape (no hub: SmolLM2-1.7B's by
default, bfloat16). Greedy, `--max-tokens` new tokens per request; the engine at each concurrency
and each `cuda_graphs` setting. Prints one JSON line per configuration, then a table.

    python -m scripts.bench gpu --tokenizer DIR                       # 1.7B shape, c1 c8 c32, graphs off and on
    python -m scripts.bench gpu --tokenizer DIR --shape tiny --concurrency 1 4    # a quick check (CPU too)

`--tokenizer`: a directory with a saved tokenizer and chat template (`scripts/gpu_check.sh` saves
the SmolLM2 one there from the offline default GGUF). The roofline is the weights' bytes over the
bandwidth measured here by a large device-to-device copy: one decode step must read every weight
once, so no engine passes it at concurrency 1.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from scripts.bench import common

SHAPES: dict[str, dict[str, Any]] = {
    "smollm2-1.7b": {
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_hidden_layers": 24,
        "num_attention_heads": 32,
        "num_key_value_heads": 32,
        "tie_word_embeddings": True,
    },
    "tiny": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4},
}
PROMPTS = ["Write a story about a lighthouse.", "List the planets.", "Explain rain to a child.", "Describe Paris."]


def emit(record: dict[str, Any]) -> dict[str, Any]:
    common.emit(record)
    return record


def build_model(shape: str, tokenizer_dir: Path, out: Path, device: str) -> tuple[Path, int]:
    """A random-weight Llama of `shape` with the tokenizer of `tokenizer_dir`, saved to `out`; its bytes."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    config = LlamaConfig(
        vocab_size=len(tok),
        max_position_embeddings=2048,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.eos_token_id,
        **SHAPES[shape],
    )
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(config).to(dtype)
    size = sum(p.numel() * p.element_size() for p in model.parameters())
    model.save_pretrained(out)
    tok.save_pretrained(out)
    del model
    return out, size


def bandwidth(device: str) -> float | None:
    """Bytes per second of a device-to-device copy of 1 GiB (read plus write), best of 10."""
    if not device.startswith("cuda"):
        return None
    src = torch.empty(2**30, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(10):
        torch.cuda.synchronize()
        start = time.perf_counter()
        dst.copy_(src)
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return 2 * src.numel() / best


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def plain_generate(model_dir: Path, device: str, batch: int, max_tokens: int) -> dict[str, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype="auto").to(device).eval()
    chats = [[{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}] for i in range(batch)]
    texts = [tok.apply_chat_template(c, add_generation_prompt=True, tokenize=False) for c in chats]
    inputs = tok(texts, return_tensors="pt", padding=True).to(device)
    kwargs = {"max_new_tokens": max_tokens, "min_new_tokens": max_tokens, "do_sample": False}
    model.generate(**inputs, max_new_tokens=4, do_sample=False)  # warm-up
    _sync(device)
    start = time.perf_counter()
    out = model.generate(**inputs, **kwargs)
    _sync(device)
    elapsed = time.perf_counter() - start
    tokens = (out.shape[1] - inputs["input_ids"].shape[1]) * batch
    del model
    return {"config": "plain generate", "concurrency": batch, "tok_s": round(tokens / elapsed, 1)}


async def engine_run(model_dir: Path, cuda_graphs: str, concurrency: list[int], max_tokens: int) -> list[dict]:
    from deployments.config import ModelConfig
    from deployments.engines import create_text_engine
    from deployments.protocol.replica import GenerateRequest, TextMessage

    params = {"max_num_seqs": max(concurrency), "max_model_len": 1024, "cuda_graphs": cuda_graphs}
    engine = create_text_engine(
        ModelConfig(name="bench", engine="transformers", local_path=str(model_dir), params=params)
    )
    records = []
    try:
        graphs = engine.describe().get("cuda_graphs")

        async def one(i: int) -> tuple[int, float]:
            request = GenerateRequest(
                messages=[TextMessage(role="user", content=PROMPTS[i % len(PROMPTS)])],
                temperature=0,
                max_tokens=max_tokens,
            )
            start, first, tokens = time.perf_counter(), None, 0
            async for piece in engine.generate(request):
                first = first or time.perf_counter() - start
                tokens = piece.completion_tokens
            return tokens, first or 0.0

        await one(0)  # warm-up (and, with graphs, the first captures)
        for c in concurrency:
            start = time.perf_counter()
            results = await asyncio.gather(*(one(i) for i in range(c)))
            elapsed = time.perf_counter() - start
            records.append(
                {
                    "config": f"engine, cuda_graphs {cuda_graphs} ({'captured' if graphs else 'eager'})",
                    "concurrency": c,
                    "tok_s": round(sum(t for t, _ in results) / elapsed, 1),
                    "ttft_p50_s": round(statistics.median(f for _, f in results), 4),
                }
            )
    finally:
        engine.close()
    return records


def main(argv: list[str] | None = None) -> None:
    parser = common.arguments("gpu", __doc__)
    parser.add_argument("--tokenizer", type=Path, required=True)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="smollm2-1.7b")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--cuda-graphs", nargs="+", default=["off", "on"], choices=["auto", "on", "off"])
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--no-generate", action="store_true", help="skip plain generate")
    args = parser.parse_args(argv)
    device = "cuda:0" if torch.cuda.is_available() else "cpu"
    card = torch.cuda.get_device_name(0) if device != "cpu" else "cpu"
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        model_dir, size = build_model(args.shape, args.tokenizer, Path(tmp) / "model", device)
        bw = bandwidth(device)
        if bw:
            rows.append(
                emit({"config": "roofline (weights / copy bandwidth)", "concurrency": 1, "tok_s": round(bw / size, 1)})
            )
        for mode in args.cuda_graphs:
            rows += [emit(r) for r in asyncio.run(engine_run(model_dir, mode, args.concurrency, args.max_tokens))]
        if not args.no_generate:
            for batch in sorted({1, min(8, max(args.concurrency))}):
                rows.append(emit(plain_generate(model_dir, device, batch, args.max_tokens)))
    print(f"\n{args.shape}, {size / 1e9:.2f} GB of weights, {card}, {args.max_tokens} greedy tokens")
    print(f"{'configuration':<48} {'c':>4} {'tok/s':>9} {'TTFT p50':>9}")
    for r in rows:
        ttft = f"{r['ttft_p50_s']:.3f}" if "ttft_p50_s" in r else ""
        print(f"{r['config']:<48} {r['concurrency']:>4} {r['tok_s']:>9} {ttft:>9}")
