"""Weight-only int4 linear layers for CPU decoding (`quantization: int4-cpu`).

On a CPU, a decode step of a small model is bound by reading its weights. Each `nn.Linear` is
re-quantized to 4 bits in groups of 32 input features (a scale and an offset per group) and, for up
to `PACKED_ROWS` tokens at a time (a decode step of up to 16 sequences), multiplied by torch's CPU
int4 kernel with bfloat16 activations: a quarter of bfloat16's weight bytes. That kernel's cost
grows with every row, so a longer input (a prompt chunk) multiplies in bfloat16 by the layer's own
weights, which stay loaded: 1.5x faster at 32 rows, 2.5x at 200 (docs/benchmarks.md). A GGUF
Q4_0/Q4_1 layer is 16 levels per block of 32 already, so min/max per group of 32 gives back its
weights (the activations are bfloat16, as with `dtype: bfloat16`).

The output embedding (`lm_head`) is packed the same way, and then each position's `TOP` highest
logits are recomputed in float32 (`ExactTopLogits`): with 4-bit logits alone, greedy tokens agreed
with float32's 88.8% of the time instead of 99.0% (docs/benchmarks.md), and even bfloat16 logits
near 20 are only known to 0.125; SmolLM2's "The" (15.6%) and "L'" (13.8%) for the capital of France
are 0.12 apart, and a continuous batch answered "L'Étoile".
"""

from __future__ import annotations

import torch
from torch import nn

GROUP = 32  # input features per scale/offset pair; the kernel takes 32, 64, 128 or 256
TOP = 16  # logits per position recomputed in float32: the greedy pick and its close rivals
PACKED_ROWS = 16  # up to this many tokens a layer multiplies by its 4-bit weights; more (a prompt) in bfloat16


def available() -> bool:
    """Whether this torch has the CPU int4 matmul kernel that `Int4Linear` needs."""
    return hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu")


class Int4Linear(nn.Module):
    """`y = x @ W.T + b` with `W` stored as packed 4-bit codes, per group `W = (code - 8) * scale + zero`."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        # The layer's own weights, for more than `PACKED_ROWS` tokens at once (bfloat16 after `quantize`).
        self.weight, self.bias = linear.weight, linear.bias
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

    @staticmethod
    def fits(linear: nn.Linear) -> bool:
        return linear.in_features % GROUP == 0 and linear.out_features % 16 == 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features)
        if flat.shape[0] > PACKED_ROWS:
            y = nn.functional.linear(flat.to(self.weight.dtype), self.weight, self.bias)
        else:
            y = torch.ops.aten._weight_int4pack_mm_for_cpu(
                flat.to(torch.bfloat16), self.packed, GROUP, self.scales_zeros
            )
            if self.bias is not None:
                y = y + self.bias.to(y.dtype)
        return y.reshape(*x.shape[:-1], self.out_features).to(x.dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, group={GROUP}"


class ExactTopLogits(nn.Module):
    """Logits from a packed output embedding (or a bfloat16 one, where it does not fit), the `TOP`
    highest of each position in float32.
    """

    def __init__(self, head: nn.Linear) -> None:
        super().__init__()
        # Its weight stays the input embedding's if tied: one bfloat16 copy.
        self.approximate: nn.Module = Int4Linear(head) if Int4Linear.fits(head) else head
        # Plain attributes, not buffers: the model's move to bfloat16 leaves them in float32.
        self.exact = head.weight.detach().float().clone()
        self.exact_bias = None if head.bias is None else head.bias.detach().float().clone()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.approximate(x).float()
        flat, hidden = logits.view(-1, logits.shape[-1]), x.reshape(-1, x.shape[-1]).float()
        top = flat.topk(TOP, dim=-1).indices
        exact = torch.einsum("nd,ntd->nt", hidden, self.exact[top])
        if self.exact_bias is not None:
            exact += self.exact_bias[top]
        flat.scatter_(1, top, exact)
        return logits


def quantize(model: nn.Module) -> int:
    """Pack every fitting `nn.Linear`, the output embedding with exact top logits, and move the rest
    (and the layers' own weights) to bfloat16, in place; returns how many layers were packed, the
    output embedding not counted.
    """
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
    model.to(torch.bfloat16)  # the layers' own weights, embeddings and norms, and so the activations
    return replaced
