"""Weight-only int4 linear layers for CPU decoding (`quantization: int4-cpu`).

On a CPU, decoding a small model is bound by reading its weights once per step. Each `nn.Linear`
is re-quantized to 4 bits in groups of 32 input features (a scale and an offset per group) and
multiplied by torch's CPU int4 kernel with bfloat16 activations: a quarter of bfloat16's weight
bytes. A GGUF Q4_0/Q4_1 layer is 16 levels per block of 32 already, so min/max per group of 32
gives back its weights (the activations are bfloat16, as with `dtype: bfloat16`).

The output embedding (`lm_head`) is not packed: at 4 bits, greedy tokens agreed with float32's
88.8% of the time instead of 99.0% (docs/benchmarks.md). It multiplies in bfloat16, and then each
position's `TOP` highest logits are recomputed in float32 (`ExactTopLogits`): a bfloat16 logit near
20 is only known to 0.125, and SmolLM2's "The" (15.6%) and "L'" (13.8%) for the capital of France
are 0.12 apart; in bfloat16 a continuous batch answered "L'Étoile".
"""

from __future__ import annotations

import torch
from torch import nn

GROUP = 32  # input features per scale/offset pair; the kernel takes 32, 64, 128 or 256
TOP = 16  # logits per position recomputed in float32: the greedy pick and its close rivals


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


class ExactTopLogits(nn.Module):
    """Logits from a bfloat16 output embedding, the `TOP` highest of each position in float32."""

    def __init__(self, head: nn.Linear) -> None:
        super().__init__()
        self.weight, self.bias = head.weight, head.bias  # the weight stays the input embedding's if tied
        # Plain attributes, not buffers: the model's move to bfloat16 leaves them in float32.
        self.exact = head.weight.detach().float().clone()
        self.exact_bias = None if head.bias is None else head.bias.detach().float().clone()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = nn.functional.linear(x.to(self.weight.dtype), self.weight, self.bias).float()
        flat, hidden = logits.view(-1, logits.shape[-1]), x.reshape(-1, x.shape[-1]).float()
        top = flat.topk(TOP, dim=-1).indices
        exact = torch.einsum("nd,ntd->nt", hidden, self.exact[top])
        if self.exact_bias is not None:
            exact += self.exact_bias[top]
        flat.scatter_(1, top, exact)
        return logits


def quantize(model: nn.Module) -> int:
    """Pack every fitting `nn.Linear` but the output embedding, which gets exact top logits, and move
    the rest to bfloat16, in place; returns how many layers were packed."""
    output_embeddings = getattr(model, "get_output_embeddings", None)
    head = output_embeddings() if callable(output_embeddings) else None
    replaced = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear) and child is head:
                setattr(parent, name, ExactTopLogits(child))
            elif isinstance(child, nn.Linear) and Int4Linear.fits(child):
                setattr(parent, name, Int4Linear(child))
                replaced += 1
    model.to(torch.bfloat16)  # what stays unpacked (embeddings, norms, the head), and so the activations
    return replaced
