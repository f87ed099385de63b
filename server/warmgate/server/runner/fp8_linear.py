"""Linear layers over FP8 weights: the torch reference, the GPU kernels, and the quantizers.

A projection's weight is float8_e4m3fn [N, K] with one of two scale layouts:
- per row, float32 [N] (a per-tensor checkpoint's scale repeated over its rows, so that q/k/v
  and gate/up, each with its own scale, fuse into one matmul; a per-channel one as it is);
- per 128x128 block, float32 [ceil(N/128), ceil(K/128)] (the block format's layout).
The value of weight element (n, k) is weight[n, k] * scale[n] (or scale[n // 128, k // 128]).

On the CPU the weight is dequantized and multiplied in the activations' dtype: the reference,
which equals a float model holding the dequantized weights. On CUDA the activations are
quantized on the fly, per token (per row) for the row-scaled weights, which then run on
`torch._scaled_mm` (cuBLASLt, row-wise scales), and per token and 128-wide group for the
block-scaled ones, which run on the Triton GEMM of kernels.fp8_block_gemm (a torch custom op,
so torch.compile and CUDA graphs take it as one opaque call). A static input scale (ModelOpt,
compressed-tensors' static activations) replaces the per-token scale with the checkpoint's.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from warmgate.server.config.fp8_config import FP8_BLOCK, FP8_E4M3_MAX, FP8Config

FP8_DTYPE = torch.float8_e4m3fn
# A row (group) of zeros would get scale 0 and divide by it.
_MIN_SCALE = 1e-12


def scale_shape(fp8: FP8Config, rows: int, cols: int) -> tuple[int, ...]:
    """The in-memory scale of a [rows, cols] FP8 weight (see the module docstring)."""
    if fp8.scheme == "block":
        return (-(-rows // FP8_BLOCK), -(-cols // FP8_BLOCK))
    return (rows,)


def expand_block_scale(scale: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """[..., ceil(rows/128), ceil(cols/128)] -> [..., rows, cols]: each block's scale on its
    elements."""
    full = scale.repeat_interleave(FP8_BLOCK, dim=-2).repeat_interleave(FP8_BLOCK, dim=-1)
    return full[..., :rows, :cols]


def dequantize(weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """FP8 weight [..., N, K] and its scale (either layout) -> float32 [..., N, K]."""
    w = weight.float()
    if scale.dim() == weight.dim():  # blocks
        return w * expand_block_scale(scale.float(), w.shape[-2], w.shape[-1])
    return w * scale.float().unsqueeze(-1)


def quantize(weight: torch.Tensor, fp8: FP8Config) -> tuple[torch.Tensor, torch.Tensor]:
    """A float weight [..., N, K] -> (float8_e4m3fn weight, scale) in fp8's layout: the scale
    maps the amax of the tensor (per-tensor), the row or the block onto the e4m3 range."""
    w = weight.float()
    rows, cols = w.shape[-2], w.shape[-1]
    if fp8.scheme == "block":
        nb_r, nb_c = -(-rows // FP8_BLOCK), -(-cols // FP8_BLOCK)
        padded = w.new_zeros(*w.shape[:-2], nb_r * FP8_BLOCK, nb_c * FP8_BLOCK)
        padded[..., :rows, :cols] = w
        blocks = padded.unflatten(-1, (nb_c, FP8_BLOCK)).unflatten(-3, (nb_r, FP8_BLOCK))
        scale = blocks.abs().amax(dim=(-3, -1)) / FP8_E4M3_MAX  # [..., nb_r, nb_c]
        scale = scale.clamp(min=_MIN_SCALE)
        q = w / expand_block_scale(scale, rows, cols)
    else:
        if fp8.scheme == "channel":
            scale = w.abs().amax(dim=-1) / FP8_E4M3_MAX  # [..., N]
        else:  # one scale over the last two dimensions, repeated per row
            scale = (w.abs().amax(dim=(-2, -1), keepdim=True) / FP8_E4M3_MAX).squeeze(-1)
            scale = scale.expand(*w.shape[:-1])
        scale = scale.clamp(min=_MIN_SCALE)
        q = w / scale.unsqueeze(-1)
    return q.clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(FP8_DTYPE), scale.contiguous()


def fill_fp8(weight: torch.Tensor, scale: torch.Tensor, fp8: FP8Config,
             draw: Callable[[torch.Tensor], object]) -> None:
    """Fill an FP8 weight and its scale with `draw`'s float32 numbers, quantized."""
    values = torch.empty(weight.shape, dtype=torch.float32, device=weight.device)
    draw(values)
    q, s = quantize(values, fp8)
    weight.copy_(q)
    scale.copy_(s)


def quantize_rows(x: torch.Tensor, input_scale: torch.Tensor | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Activations [M, K] -> (float8_e4m3fn [M, K], float32 scales [M, 1]): per row (token)
    from its amax, or the static per-tensor input_scale ([] or [1]) on every row."""
    xf = x.float()
    if input_scale is None:
        scale = (xf.abs().amax(dim=-1, keepdim=True) / FP8_E4M3_MAX).clamp(min=_MIN_SCALE)
    else:
        scale = input_scale.float().reshape(1, 1).expand(x.shape[0], 1).contiguous()
    q = (xf / scale).clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(FP8_DTYPE)
    return q, scale


def _scaled_mm_linear(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
                      input_scale: torch.Tensor | None) -> torch.Tensor:
    """cuBLASLt FP8 GEMM with row-wise scales on both sides: [M, K] x [N, K]^T -> [M, N].
    Row-wise scaling writes bf16 only; the result is cast to x's dtype."""
    xq, x_scale = quantize_rows(x, input_scale)
    out = torch._scaled_mm(xq, weight.t(), scale_a=x_scale, scale_b=scale.view(1, -1),
                           out_dtype=torch.bfloat16)
    return out.to(x.dtype)


def fp8_linear(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor | None,
               input_scale: torch.Tensor | None = None, bias: torch.Tensor | None = None
               ) -> torch.Tensor:
    """F.linear for any projection: plain when scale is None (a served-dtype weight), else
    FP8 as the module docstring says. x: [T, K] -> [T, N]."""
    if scale is None:
        return F.linear(x, weight, bias)
    if not weight.is_cuda:
        out = F.linear(x, dequantize(weight, scale).to(x.dtype))
    elif scale.dim() == 2:
        out = torch.ops.warmgate.fp8_block_linear(x, weight, scale)
    else:
        out = _scaled_mm_linear(x, weight, scale, input_scale)
    return out if bias is None else out + bias


def register_cuda_kernels(fp8: FP8Config | None, device: torch.device) -> None:
    """Import the block GEMM's custom op where a block-scaled model runs on CUDA (importing
    it imports triton), before any forward is traced."""
    if fp8 is not None and fp8.scheme == "block" and device.type == "cuda":
        import warmgate.server.kernels.fp8_block_gemm  # noqa: F401
