"""Random LoRA adapters for small models, nothing downloaded: PEFT ones for the tiny Llama the tests build
(`build_tiny_llm`), GGUF ones for a GGUF model (the offline default). Non-zero lora_B, so that an adapter
changes the answer. The tests' fixtures and the `lora` benchmark's adapters.
"""

from __future__ import annotations

from pathlib import Path

import torch


def build_lora(base_dir: Path, out: Path, *, seed: int, rank: int = 4) -> Path:
    """A LoRA adapter for the model in `base_dir` (its config names it as its base), saved in `out`."""
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(base_dir)
    torch.manual_seed(seed)
    config = LoraConfig(
        r=rank, lora_alpha=2 * rank, target_modules=["q_proj", "v_proj", "o_proj", "down_proj"], init_lora_weights=False
    )
    peft_model = get_peft_model(model, config)
    with torch.no_grad():  # PEFT's random init is small: scale lora_B up so that greedy answers change
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.mul_(20.0)
    peft_model.save_pretrained(out)
    return out


def build_merged(base_dir: Path, adapter: Path, out: Path) -> Path:
    """The base model with `adapter` merged into its weights, saved with its tokenizer in `out`."""
    from peft import PeftModel
    from transformers import AutoTokenizer, LlamaForCausalLM

    merged = PeftModel.from_pretrained(LlamaForCausalLM.from_pretrained(base_dir), adapter).merge_and_unload()
    merged.save_pretrained(out)
    AutoTokenizer.from_pretrained(base_dir).save_pretrained(out)
    return out


def build_gguf_lora(
    base_gguf: Path, out: Path, *, seed: int, rank: int = 4, alpha: float = 8.0, widen: int = 1
) -> Path:
    """A random GGUF LoRA adapter (llama.cpp's layout, as convert_lora_to_gguf.py writes it) for the
    attention query and value projections of every block of the GGUF model `base_gguf` (`widen` > 1:
    for a wider model, another base).
    """
    import gguf
    import numpy as np

    from deployments.config.gguf import read_gguf

    meta, shapes = read_gguf(base_gguf)  # ggml order: [in, out]
    arch = meta["general.architecture"]
    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(out, arch)
    writer.add_string("general.type", "adapter")
    writer.add_string("adapter.type", "lora")
    writer.add_float32("adapter.lora.alpha", alpha)
    for name, (size_in, size_out) in sorted(
        (n, s) for n, s in shapes.items() if n.endswith(("attn_q.weight", "attn_v.weight"))
    ):
        writer.add_tensor(
            f"{name}.lora_a", rng.normal(0, 0.1, (rank, size_in * widen)).astype(np.float32)
        )  # PEFT's lora_A
        writer.add_tensor(f"{name}.lora_b", rng.normal(0, 0.1, (size_out, rank)).astype(np.float32))  # PEFT's lora_B
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out
