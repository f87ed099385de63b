"""The hot element-wise ops the model calls, behind one object.

The model never calls these functions directly but through an ops object passed to its
constructor, so a Triton implementation with the same method signatures can replace
`TorchOps` without touching the model. Every op computes in float32 and returns the input
dtype: bf16 rounding inside a norm or a rotation drifts more than the kernels we compare to.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from warmgate.server.config.rope_config import RopeConfig
from warmgate.server.runner.rope import cos_sin_cache


def build_cos_sin_cache(max_position: int, head_dim: int, rope: RopeConfig | float,
                        device: torch.device | str = "cpu") -> torch.Tensor:
    """[max_position, head_dim] float32: cos of every (position, frequency) in the first half,
    sin in the second half (the layout vLLM's rotary kernels read), both already multiplied by
    the rope type's attention factor (yarn's). Every backend's rotary reads this cache, so the
    rope type lives here alone. A float `rope` is plain RoPE with that theta."""
    if head_dim % 2:
        raise ValueError(f"head_dim must be even for rotary embeddings, got {head_dim}")
    if not isinstance(rope, RopeConfig):
        rope = RopeConfig(theta=float(rope))
    return cos_sin_cache(max_position, head_dim, rope, device)


class TorchOps:
    """Reference implementations in plain torch; correct on CPU and CUDA."""

    name = "torch"
    # Whether every reduction runs one token row at a time (--deterministic on the CPU).
    row_wise = False

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float,
                 residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """RMSNorm with the residual add fused in front of it.

        x: [T, H]; weight: [H]; residual: [T, H] or None.
        Returns (normed [T, H], new_residual [T, H]) where new_residual = x + residual (or x
        itself when there is no residual): the stream the next layer adds onto.
        """
        if residual is not None:
            x = x + residual
        xf = x.float()
        variance = xf.pow(2).mean(dim=-1, keepdim=True)
        normed = (xf * torch.rsqrt(variance + eps)).to(x.dtype)
        return normed * weight, x

    def linear(self, x: torch.Tensor, weight: torch.Tensor,
               bias: torch.Tensor | None = None) -> torch.Tensor:
        """x: [T, K] @ weight [N, K]^T (+ bias [N]) -> [T, N]: every projection and the head."""
        return F.linear(x, weight) if bias is None else F.linear(x, weight, bias)

    def norm_linear(self, x: torch.Tensor, residual: torch.Tensor | None,
                    norm_weight: torch.Tensor, eps: float, weight: torch.Tensor,
                    bias: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """rms_norm(x, norm_weight, eps, residual) then linear on its output: (out [T, N],
        new_residual [T, H]), which an ops object may run as one kernel."""
        normed, residual = self.rms_norm(x, norm_weight, eps, residual)
        return self.linear(normed, weight, bias), residual

    def norm_moe(self, x: torch.Tensor, residual: torch.Tensor | None,
                 norm_weight: torch.Tensor, eps: float, moe: Callable[[torch.Tensor], torch.Tensor]
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        """rms_norm(x, norm_weight, eps, residual) then the MoE block on its output: (out
        [T, H], new_residual [T, H]), which an ops object may fuse into the router."""
        normed, residual = self.rms_norm(x, norm_weight, eps, residual)
        return moe(normed), residual

    def log_softmax(self, logits: torch.Tensor) -> torch.Tensor:
        """logits: [R, V] -> float32 log-probabilities [R, V] (the logprobs' normaliser)."""
        return torch.log_softmax(logits.float(), dim=-1)

    def silu_and_mul(self, x: torch.Tensor) -> torch.Tensor:
        """x: [T, 2I] holding gate then up -> [T, I] = silu(gate) * up."""
        half = x.shape[-1] // 2
        gate, up = x[..., :half], x[..., half:]
        return (F.silu(gate.float()) * up.float()).to(x.dtype)

    def silu_mul_linear(self, gate_up: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """gate_up: [T, 2I] -> silu_and_mul -> @ weight [N, I]^T -> [T, N]: the MLP's
        activation and down projection, which an ops object may run as one kernel."""
        return self.linear(self.silu_and_mul(gate_up), weight)

    def norm_mlp(self, x: torch.Tensor, residual: torch.Tensor, norm_weight: torch.Tensor,
                 eps: float, gate_up: torch.Tensor, down: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        """rms_norm, the gate/up projection [2I, H], SiLU-and-mul and the down projection
        [H, I]: (out [T, H], new_residual [T, H]), the SwiGLU MLP with its norm, which an ops
        object may run in fewer kernels (norm_linear then silu_mul_linear here)."""
        gate_up_out, residual = self.norm_linear(x, residual, norm_weight, eps, gate_up)
        return self.silu_mul_linear(gate_up_out, down), residual

    def rotary(self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor,
               cos_sin_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """NeoX/Llama "rotate half" rotary embedding.

        q: [T, Hq, D]; k: [T, Hk, D]; positions: [T] int64; cos_sin_cache: [max_pos, D].
        Returns rotated (q, k) with the input shapes and dtypes.
        """
        cos_sin = cos_sin_cache.index_select(0, positions)  # [T, D]
        half = cos_sin.shape[-1] // 2
        cos = cos_sin[:, None, :half].float()  # [T, 1, D/2]
        sin = cos_sin[:, None, half:].float()  # [T, 1, D/2]
        return _rotate(q, cos, sin), _rotate(k, cos, sin)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    x1 = x[..., :half].float()
    x2 = x[..., half:].float()
    out = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
    return out.to(x.dtype)
