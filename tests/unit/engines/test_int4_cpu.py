"""`quantization: int4-cpu`: the int4 layer, the model rewrite, its config rules and the captioner on it.
The real GGUF decoder on int4-cpu: `test_engines.py::test_offline_default_gguf_answers_concurrent_questions`."""

import pytest
import torch
from PIL import Image
from torch import nn

from deployments.config import CaptioningConfig, EngineParams, ModelConfig
from deployments.engines import create_caption_engine
from deployments.engines.transformers import int4_cpu
from deployments.engines.transformers.loading import load_kwargs, quantization_kwargs, quantize_loaded
from deployments.errors import ConfigError

pytestmark = pytest.mark.skipif(not int4_cpu.available(), reason="this torch has no CPU int4 kernel")


def q4_layer(out_features: int = 48, in_features: int = 96) -> nn.Linear:
    """A layer as a GGUF Q4_1 file stores it: per block of 32 inputs, code * scale + min, codes 0..15."""
    gen = torch.Generator().manual_seed(0)
    blocks = in_features // 32
    codes = torch.randint(0, 16, (out_features, blocks, 32), generator=gen)
    codes[..., 0], codes[..., 1] = 0, 15  # every block spans its full range, as a quantizer leaves it
    # scales and mins exactly representable in bfloat16, like GGUF's float16 ones mostly are
    scale = (torch.rand(out_features, blocks, 1, generator=gen) * 0.05 + 0.01).bfloat16().float()
    low = (torch.randn(out_features, blocks, 1, generator=gen) * 0.1).bfloat16().float()
    layer = nn.Linear(in_features, out_features, bias=True)
    with torch.no_grad():
        layer.weight.copy_((codes * scale + low).reshape(out_features, in_features))
        layer.bias.copy_(torch.randn(out_features, generator=gen))
    return layer.requires_grad_(False)


def read_weights(layer: nn.Module, in_features: int) -> torch.Tensor:
    """Multiplying by the identity, a decode step's worth of rows at a time, reads the weights back out
    of the int4 kernel (in bfloat16)."""
    eye = torch.eye(in_features, dtype=torch.bfloat16)
    return torch.cat([layer(rows) for rows in eye.split(int4_cpu.PACKED_ROWS)]).float().T


def test_a_q4_layer_keeps_its_weights_at_4_bits():
    layer = q4_layer()
    packed = int4_cpu.Int4Linear(layer)
    weights_only = nn.Linear(96, 48, bias=False).requires_grad_(False)
    weights_only.weight.copy_(layer.weight)
    recovered = read_weights(int4_cpu.Int4Linear(weights_only), 96)
    assert torch.allclose(recovered, layer.weight, rtol=0, atol=float(layer.weight.abs().max()) * 2**-7)
    x = torch.randn(5, 3, 96)  # 15 tokens: the int4 kernel
    y = packed(x)
    assert y.shape == (5, 3, 48) and y.dtype == x.dtype
    assert torch.allclose(y, layer(x), rtol=0.02, atol=0.05)
    stored = sum(b.numel() * b.element_size() for b in packed.buffers())
    assert stored < layer.weight.numel() * 2 / 3  # well under bfloat16's 2 bytes per weight


def test_a_prompt_multiplies_by_the_layers_own_weights():
    """The int4 kernel's cost grows with every row: more than `PACKED_ROWS` tokens (a prompt chunk)
    take the layer's own weights (bfloat16 in a quantized model), exactly as the layer did."""
    layer = q4_layer()
    packed = int4_cpu.Int4Linear(layer)
    prompt = torch.randn(1, int4_cpu.PACKED_ROWS + 1, 96)
    assert torch.equal(packed(prompt), layer(prompt))
    step = prompt[:, : int4_cpu.PACKED_ROWS]
    assert not torch.equal(packed(step), layer(step))  # the kernel, in bfloat16
    assert torch.allclose(packed(step), layer(step), rtol=0.02, atol=0.05)


def test_an_arbitrary_layer_is_rounded_to_16_levels_per_group():
    torch.manual_seed(1)
    layer = nn.Linear(64, 32, bias=False).requires_grad_(False)
    recovered = read_weights(int4_cpu.Int4Linear(layer), 64)
    error = (recovered - layer.weight).abs()
    group_range = layer.weight.reshape(32, 2, 32).amax(-1) - layer.weight.reshape(32, 2, 32).amin(-1)
    assert error.max() > 0  # really 4 bits, not a copy
    assert (error.reshape(32, 2, 32) <= group_range[..., None] / 30 * 1.05 + 1e-3).all()  # half a step


def test_quantize_packs_every_fitting_linear_and_gives_the_head_exact_top_logits(tiny_llm_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_llm_dir, dtype=torch.float32)
    head = model.lm_head.weight.detach().clone()
    linears = [n for n, m in model.named_modules() if isinstance(m, nn.Linear) and m is not model.lm_head]
    assert int4_cpu.quantize(model) == len(linears) > 0
    assert not any(isinstance(m, nn.Linear) for m in model.modules())
    assert isinstance(model.lm_head, int4_cpu.ExactTopLogits) and model.dtype == torch.bfloat16
    assert isinstance(model.lm_head.approximate, int4_cpu.Int4Linear)
    assert torch.equal(model.lm_head.exact, head)  # the float32 weights, not their bfloat16 rounding
    if model.config.tie_word_embeddings:
        assert model.lm_head.approximate.weight is model.get_input_embeddings().weight  # one bfloat16 copy
    odd = nn.Sequential(nn.Linear(40, 32), nn.Linear(32, 20))  # 40 inputs: no group of 32; 20 outputs
    assert int4_cpu.quantize(odd) == 0


@pytest.mark.parametrize("vocab", [304, 300])  # 304 rows are packed; 300 (no multiple of 16) stay bfloat16
def test_top_logits_are_float32s_so_a_near_tie_keeps_its_order(vocab):
    gen = torch.Generator().manual_seed(2)
    weight = torch.randn(vocab, 64, generator=gen) * 0.1
    weight[7, 0], weight[9, 0] = 20.0, 20.05  # 0.05 apart; bfloat16 has 0.125 between values near 20
    hidden = torch.zeros(2, 1, 64)
    hidden[..., 0] = 1.0
    hidden[1, 0, 1:] = torch.randn(63, generator=gen)
    float32 = hidden.bfloat16().float() @ weight.T  # the activations are bfloat16 either way
    layer = nn.Linear(64, vocab, bias=False).requires_grad_(False)
    layer.weight.copy_(weight)
    head = int4_cpu.ExactTopLogits(layer).to(torch.bfloat16)
    assert isinstance(head.approximate, int4_cpu.Int4Linear) == (vocab == 304)
    logits = head(hidden.bfloat16())
    rounded = (hidden.bfloat16() @ weight.bfloat16().T).float()
    assert rounded[0, 0, 7] == rounded[0, 0, 9]  # bfloat16 alone cannot tell them apart...
    assert logits.dtype == torch.float32 and int(logits[0, 0].argmax()) == 9  # ...the head can
    top = float32.topk(int4_cpu.TOP // 2, dim=-1).indices  # surely among bfloat16's `TOP` highest
    assert torch.allclose(logits.gather(-1, top), float32.gather(-1, top), rtol=0, atol=1e-5)
    rest = logits == head.approximate(hidden.bfloat16()).float()  # the rest: the head's own (4 or 16 bits)
    assert (rest.sum(-1) >= vocab - int4_cpu.TOP).all()
    assert torch.allclose(logits[rest], float32[rest], rtol=0, atol=0.07 if vocab == 300 else 0.3)


def test_config_rules(monkeypatch):
    with pytest.raises(ValueError, match="int4-cpu computes in bfloat16"):
        EngineParams(quantization="int4-cpu", dtype="float32")
    params = EngineParams(quantization="int4-cpu")
    assert quantization_kwargs(params, "cpu") == quantization_kwargs(params, "cuda:0") == {}
    monkeypatch.setattr(int4_cpu, "available", lambda: False)
    with pytest.raises(ConfigError, match="CPU int4 kernel"):
        quantization_kwargs(params, "cpu")
    monkeypatch.undo()
    for dtype in ("auto", "bfloat16"):  # loaded exactly, packed, then bfloat16
        params = EngineParams(quantization="int4-cpu", dtype=dtype)
        device, _, kwargs = load_kwargs(ModelConfig(name="x", local_path=".", params=params))
        assert device == "cpu" and kwargs["dtype"] == torch.float32


def test_a_gpu_replica_leaves_the_model_as_loaded(tiny_llm_dir):
    """One models.yaml serves CPU and GPU machines: on a GPU, int4-cpu does nothing (and says so)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_llm_dir, dtype=torch.float32)
    assert quantize_loaded(model, EngineParams(quantization="int4-cpu"), "cuda:0") == 0
    assert isinstance(model.lm_head, nn.Linear) and model.dtype == torch.float32
    assert quantize_loaded(model, EngineParams(quantization="int4-cpu"), "cpu") > 0


def test_the_captioner_runs_on_int4(tiny_vlm_dir):
    params, captioning = EngineParams(quantization="int4-cpu"), CaptioningConfig(max_new_tokens=6)
    model = ModelConfig(name="tiny", local_path=str(tiny_vlm_dir), params=params, captioning=captioning)
    engine = create_caption_engine(model)
    info = engine.describe()
    assert info["int4_layers"] > 0 and info["dtype"] == "bfloat16"
    red, blue = Image.new("RGB", (64, 48), (255, 0, 0)), Image.new("RGB", (30, 60), (0, 0, 255))
    batch = engine.caption([red, blue], ["Describe.", "Describe this image, please."])
    assert len(batch) == 2 and all(batch) and engine.caption([red], ["Describe."])[0]
    # Not compared with the batch: a prompt multiplies in bfloat16, whose sums depend on the batch's
    # shape, and this random model's near-ties flip (float32 captions are: test_engines.py).
