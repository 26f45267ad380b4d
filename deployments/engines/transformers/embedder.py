"""A Hugging Face encoder (`AutoTokenizer` + `AutoModel`) as an `EmbedEngine`: the token states of a
batch pooled into one vector per input. A sentence-transformers layout is read as that library
does: ``modules.json`` (a ``Normalize`` module), ``1_Pooling/config.json`` (mean, cls or last token)
and ``sentence_bert_config.json`` (``max_seq_length``); the entry's `embedding:` section wins over them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModel, AutoTokenizer

from deployments.config import EmbeddingConfig, ModelConfig
from deployments.engines.base import EmbedEngine
from deployments.engines.transformers.base import TransformersEngine
from deployments.roles import Role


def pool(states: torch.Tensor, mask: torch.Tensor, mode: str) -> torch.Tensor:
    """One vector per row of `states` (batch, tokens, hidden), over the tokens `mask` keeps (right padding):
    their mean, the first token's state (cls) or the last kept token's (last).
    """
    if mode == "cls":
        return states[:, 0]
    if mode == "last":
        last = mask.sum(dim=1) - 1
        return states[torch.arange(states.shape[0], device=states.device), last]
    weights = mask.unsqueeze(-1).to(states.dtype)
    return (states * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1e-9)


def sentence_transformers_layout(folder: Path) -> dict[str, Any]:
    """What a sentence-transformers folder says (empty for a plain Hugging Face model, or a hub id):
    `pooling` (mean, cls, last), `normalize` (a Normalize module), `max_seq_length`.
    """
    found: dict[str, Any] = {}
    modules_file = folder / "modules.json"
    if not modules_file.is_file():
        return found
    modules = json.loads(modules_file.read_text())
    found["normalize"] = any(m.get("type", "").endswith(".Normalize") for m in modules)
    for module in modules:
        pooling_file = folder / module.get("path", "") / "config.json"
        if module.get("type", "").endswith(".Pooling") and pooling_file.is_file():
            config = json.loads(pooling_file.read_text())
            modes = {
                "cls": "pooling_mode_cls_token",
                "mean": "pooling_mode_mean_tokens",
                "last": "pooling_mode_lasttoken",
            }
            found["pooling"] = next((mode for mode, key in modes.items() if config.get(key)), "mean")
    bert_config = folder / "sentence_bert_config.json"
    if bert_config.is_file():
        found["max_seq_length"] = json.loads(bert_config.read_text()).get("max_seq_length")
    return found


class TransformersEmbedEngine(TransformersEngine, EmbedEngine):
    """An embedding model on transformers (`AutoModel`), pooled and normalised as its entry resolves."""

    FRONT = ("tokenizer", AutoTokenizer)
    MODEL = AutoModel

    def __init__(self, model: ModelConfig) -> None:
        super().__init__(Role.EMBEDDER, model)
        config = model.embedding or EmbeddingConfig()
        layout = sentence_transformers_layout(Path(model.source))
        self.pooling = config.pooling if config.pooling != "auto" else layout.get("pooling", "mean")
        self.normalize = config.normalize if config.normalize != "auto" else layout.get("normalize", False)
        positions = getattr(self.model.config, "max_position_embeddings", None) or 512
        self.max_input_tokens = min(config.max_input_tokens or layout.get("max_seq_length") or positions, positions)
        self.vocab_size = len(self.tokenizer)
        self.dimensions = int(self.model.config.hidden_size)
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self.progress.done(self.model)

    def describe(self) -> dict[str, Any]:
        return {
            **super().describe(),
            "pooling": self.pooling,
            "normalize": self.normalize,
            "dimensions": self.dimensions,
            "max_input_tokens": self.max_input_tokens,
        }

    def tokenize(self, texts: list[str]) -> list[list[int]]:
        return [list(ids) for ids in self.tokenizer(texts, add_special_tokens=True, truncation=False)["input_ids"]]

    def embed(self, inputs: list[list[int]]) -> list[list[float]]:
        if not inputs:
            return []
        width = max(len(ids) for ids in inputs)
        ids = torch.full((len(inputs), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(inputs), width), dtype=torch.long)
        for row, tokens in enumerate(inputs):
            ids[row, : len(tokens)] = torch.tensor(tokens, dtype=torch.long)
            mask[row, : len(tokens)] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        with torch.inference_mode():
            states = self.model(input_ids=ids, attention_mask=mask).last_hidden_state
            vectors = pool(states, mask, self.pooling).float()
            if self.normalize:
                vectors = torch.nn.functional.normalize(vectors, p=2, dim=1)
        return vectors.cpu().tolist()
