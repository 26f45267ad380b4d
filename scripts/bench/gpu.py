"""The transformers engines on a GPU, side by side in one run with plain `model.generate` and the
card's memory-bandwidth roofline, on a random-weight model of a real shape (no hub: SmolLM2-1.7B's
by default, bfloat16).

Greedy, `--max-tokens` new tokens per request, at each concurrency:

- `static`: the static-slot decoder (`batching: static`), every decode bucket captured in a CUDA
  graph at start (`static-compiled`: torch.compile'd first, compile_level 1);
- `continuous`: the old engine (transformers' continuous-batching manager), eager (cuda_graphs off),
  the baseline (`continuous-graphs`: with cuda_graphs on).

Each engine runs every concurrency once untimed first (every prefill and decode shape warmed), then
the timed runs; the static decoder's graph captures are counted over the timed window and printed
(zero: every graph is captured at start). Per run: end-to-end tok/s (tokens over wall time), decode
tok/s (each request's tokens after its first over the time from its first to its last, summed over
the requests: the steady decode rate, prefill left out) and TTFT p50. Prints one JSON line per
configuration, then a table.

    python -m scripts.bench gpu --tokenizer DIR                       # 1.7B shape, c1 c8 c32
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


ENGINES: dict[str, dict[str, Any]] = {
    "static": {"batching": "static"},
    "static-compiled": {"batching": "static", "compile_level": 1},
    "continuous": {"batching": "continuous", "cuda_graphs": "off"},
    "continuous-graphs": {"batching": "continuous", "cuda_graphs": "on"},
}


def captures(engine: Any) -> int | None:
    """Graphs the engine has captured so far (the static decoder counts them), else None."""
    decoder = getattr(engine, "decoder", None)
    return None if decoder is None else int(decoder.captures)


async def engine_run(model_dir: Path, name: str, concurrency: list[int], max_tokens: int) -> list[dict]:
    from deployments.config import ModelConfig
    from deployments.engines import create_text_engine
    from deployments.protocol.replica import GenerateRequest, TextMessage

    params = {"max_num_seqs": max(concurrency), "max_model_len": 1024, **ENGINES[name]}
    started = time.perf_counter()
    engine = create_text_engine(
        ModelConfig(name="bench", engine="transformers", local_path=str(model_dir), params=params)
    )
    load_s = time.perf_counter() - started
    records = []
    try:
        info = engine.describe()

        async def one(i: int) -> tuple[int, float, float]:
            request = GenerateRequest(
                messages=[TextMessage(role="user", content=PROMPTS[i % len(PROMPTS)])],
                temperature=0,
                max_tokens=max_tokens,
            )
            start, first, last, tokens = time.perf_counter(), None, 0.0, 0
            async for piece in engine.generate(request):
                last = time.perf_counter() - start
                first = first or last
                tokens = piece.completion_tokens
            return tokens, first or 0.0, last

        for c in concurrency:  # every shape warmed (and, with the manager's graphs, captured) before timing
            await asyncio.gather(*(one(i) for i in range(c)))
        for c in concurrency:
            before = captures(engine)
            start = time.perf_counter()
            results = await asyncio.gather(*(one(i) for i in range(c)))
            elapsed = time.perf_counter() - start
            after = captures(engine)
            decode = sum((t - 1) / (last - first) for t, first, last in results if t > 1 and last > first)
            records.append(
                {
                    "config": f"{name} ({info.get('attention')}, {info.get('graphs', info.get('cuda_graphs'))} graphs)",
                    "concurrency": c,
                    "tok_s": round(sum(t for t, _, _ in results) / elapsed, 1),
                    "decode_tok_s": round(decode, 1),
                    "ttft_p50_s": round(statistics.median(f for _, f, _ in results), 4),
                    "captures_in_window": None if before is None or after is None else after - before,
                    "load_s": round(load_s, 1),
                    "capture_s": info.get("capture_s"),
                    "graph_mb": info.get("graph_mb"),
                }
            )
    finally:
        engine.close()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return records


def main(argv: list[str] | None = None) -> None:
    parser = common.arguments("gpu", __doc__)
    parser.add_argument("--tokenizer", type=Path, required=True)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="smollm2-1.7b")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--engines", nargs="+", default=["static", "continuous"], choices=sorted(ENGINES))
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
            roofline = {"config": "roofline (weights / copy bandwidth)", "concurrency": 1, "tok_s": round(bw / size, 1)}
            rows.append(emit({**roofline, "bandwidth_gb_s": round(bw / 1e9, 1)}))
        for name in args.engines:
            rows += [emit(r) for r in asyncio.run(engine_run(model_dir, name, args.concurrency, args.max_tokens))]
        if not args.no_generate:
            for batch in sorted({1, min(8, max(args.concurrency))}):
                rows.append(emit(plain_generate(model_dir, device, batch, args.max_tokens)))
    print(f"\n{args.shape}, {size / 1e9:.2f} GB of weights, {card}, {args.max_tokens} greedy tokens")
    print(f"{'configuration':<44} {'c':>4} {'tok/s':>9} {'decode':>9} {'TTFT p50':>9} {'captures':>9}")
    for r in rows:
        ttft = f"{r['ttft_p50_s']:.3f}" if "ttft_p50_s" in r else ""
        decode = r.get("decode_tok_s", "")
        window = r.get("captures_in_window")
        print(
            f"{r['config']:<44} {r['concurrency']:>4} {r['tok_s']:>9} {decode:>9} {ttft:>9} "
            f"{'' if window is None else window:>9}"
        )
