"""Weight-only int4 linear layers for CPU decoding (`quantization: int4-cpu`).

On a CPU, decoding a small model is bound by reading its weights once per step. Each `nn.Linear`
is re-quantized to 4 bits in groups of 32 input features (a scale and an offset per group) and
multiplied by torch's CPU int4 kernel with bfloat16 activations: a quarter of bfloat16's weight
bytes. A GGUF Q4_0/Q4_1 layer is 16 levels per block of 32 already, so min/max per group of 32
gives back its weights (the activations are bfloat16, as with `dtype: bfloat16`). The output
embedding (`lm_head`) stays in bfloat16: at 4 bits, greedy tokens agreed with float32's 88.8% of
the time instead of 99.0% (docs/benchmarks.md).
"""

from __future__ import annotations

import torch
from torch import nn

GROUP = 32  # input features per scale/offset pair; the kernel takes 32, 64, 128 or 256


def available() -> bool:
    return hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu")


class Int4Linear(nn.Module):
    """`y = x @ W.T + b` with `W` stored as packed 4-bit codes, per group `W = (code - 8) * scale + zero`."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        weight = linear.weight.detach().float()
        self.out_features, self.in_features = weight.shape
        groups = weight.reshape(self.out_features, -1, GROUP)
        low, high = groups.amin(-1), groups.amax(-1)
        scale = ((high - low) / 15).clamp(min=torch.finfo(torch.float32).tiny)
        codes = ((groups - low[..., None]) / scale[..., None]).round().clamp(0, 15)
        self.register_buffer(
            "packed",
            torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.reshape(weight.shape).to(torch.int32), 1),
        )
        # [in/GROUP, out, (scale, zero)], zero being the value of code 8 (the kernel subtracts 8)
        scales_zeros = torch.stack([scale, low + 8 * scale], -1).transpose(0, 1).contiguous()
        self.register_buffer("scales_zeros", scales_zeros.to(torch.bfloat16))
        bias = None if linear.bias is None else linear.bias.detach().to(torch.bfloat16)
        self.register_buffer("bias", bias)

    @staticmethod
    def fits(linear: nn.Linear) -> bool:
        return linear.in_features % GROUP == 0 and linear.out_features % 16 == 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features).to(torch.bfloat16)
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(flat, self.packed, GROUP, self.scales_zeros)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], self.out_features).to(x.dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, group={GROUP}"


def quantize(model: nn.Module) -> int:
    """Replace every fitting `nn.Linear` except the output embedding, in place; returns how many."""
    output_embeddings = getattr(model, "get_output_embeddings", None)
    keep = output_embeddings() if callable(output_embeddings) else None
    replaced = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear) and child is not keep and Int4Linear.fits(child):
                setattr(parent, name, Int4Linear(child))
                replaced += 1
    return replaced
