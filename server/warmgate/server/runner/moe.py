"""The Mixture-of-Experts MLP of Qwen3-MoE and Mixtral layers: a router picks each token's
top-k experts, each a SwiGLU MLP, and the token's output is their routing-weighted sum.

Routing is the reference's (transformers' Qwen3MoeTopKRouter and MixtralTopKRouter): a float32
softmax over all experts' logits, the top k of it, renormalised to sum to 1 when
`norm_topk_prob` says (Mixtral always; which equals Mixtral's original softmax over the top-k
logits). Experts are stored fused, the way the grouped kernel reads them: `w13[e]` holds
expert e's gate rows, then its up rows, `w2[e]` its down projection; `weights.py` maps them to
and from the checkpoints' per-expert tensors.

The torch path (`torch_moe`) is the CPU reference: a loop over the experts that were hit,
which syncs with the host, so on CUDA the fused Triton kernel (kernels.fused_moe) runs
instead. The expert computation is kept out of torch.compile (a graph break): its loop is
data-dependent, and the Triton kernel brings its own launch configuration.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from warmgate.server.config.runner_config import ModelConfig
from warmgate.server.runner.deterministic_ops import by_rows

# (hidden [T, H], w13 [E, 2I, H], w2 [E, H, I], weights [T, k] float32, ids [T, k]) -> [T, H]
ExpertsFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
                     torch.Tensor]


def route(logits: torch.Tensor, top_k: int, renormalize: bool
          ) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [T, E] -> (weights [T, k] float32, expert ids [T, k] int64)."""
    probs = torch.softmax(logits.float(), dim=-1)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids


def torch_moe(hidden: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
              weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """The reference: each hit expert's SwiGLU over its tokens, weighted and summed."""
    # One row per (token, slot), summed at the end: a token meets each expert at most once.
    out = hidden.new_zeros(*ids.shape, hidden.shape[1])  # [T, k, H]
    inter = w2.shape[2]
    for expert in torch.unique(ids).tolist():
        token_idx, slot = torch.where(ids == expert)
        gate_up = F.linear(hidden[token_idx], w13[expert])  # [n, 2I]
        act = F.silu(gate_up[:, :inter]) * gate_up[:, inter:]
        y = F.linear(act, w2[expert]) * weights[token_idx, slot, None]
        out[token_idx, slot] = y.to(out.dtype)
    return out.sum(dim=1)


def experts_for(device: torch.device) -> ExpertsFn:
    """The fused Triton kernel on CUDA (imported only there: importing it imports triton),
    the torch reference elsewhere."""
    if device.type != "cuda":
        return torch_moe
    from warmgate.server.kernels.fused_moe import fused_moe

    return fused_moe


class MoEBlock(nn.Module):
    """A layer's routed experts: [T, H] -> [T, H]."""

    def __init__(self, config: ModelConfig, device: torch.device, dtype: torch.dtype,
                 experts: ExpertsFn | None = None, row_wise: bool = False) -> None:
        super().__init__()
        # --deterministic on the CPU: routing and experts one token at a time (the torch
        # reference's GEMM shapes and softmax then never depend on the other tokens).
        self.row_wise = row_wise
        e, h, inter = config.num_experts, config.hidden_size, config.moe_intermediate_size
        self.top_k = config.num_experts_per_tok
        self.renormalize = config.norm_topk_prob
        kw = dict(device=device, dtype=dtype)
        self.router = nn.Parameter(torch.empty(e, h, **kw), requires_grad=False)  # [E, H]
        # [E, 2I, H]: each expert's gate rows, then its up rows
        self.w13 = nn.Parameter(torch.empty(e, 2 * inter, h, **kw), requires_grad=False)
        self.w2 = nn.Parameter(torch.empty(e, h, inter, **kw), requires_grad=False)  # [E, H, I]
        # A graph break under torch.compile: the reference's loop is data-dependent, and the
        # kernel picks its own launch per token-count bucket.
        self.experts: ExpertsFn = torch.compiler.disable(
            experts_for(device) if experts is None else experts)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.row_wise:
            return by_rows(self._route_and_run, hidden)
        return self._route_and_run(hidden)

    def _route_and_run(self, hidden: torch.Tensor) -> torch.Tensor:
        weights, ids = route(F.linear(hidden, self.router), self.top_k, self.renormalize)
        return self.experts(hidden, self.w13, self.w2, weights, ids)
