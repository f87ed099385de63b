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
instead; there the router's projection and routing of a few tokens run as one launch
(kernels.moe_router), of more tokens as cuBLAS then the routing kernel (kernels.moe_route).
The routing and the expert computation are kept out of torch.compile (a graph break): the
loop is data-dependent, and the Triton kernel's launch is picked per token-count bucket on
the host (runner.moe_launches.MoELaunches, one per model: every layer has the same expert
shape).
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

import torch
import torch.nn.functional as F
from torch import nn

from warmgate.server.config.moe_kernel import ExpertShape, MoELaunch, check_moe_kernel_shape
from warmgate.server.config.runner_config import ModelConfig
from warmgate.server.runner.deterministic_ops import by_rows
from warmgate.server.runner.fp8_linear import FP8_DTYPE, dequantize, scale_shape
from warmgate.server.runner.moe_launches import MoELaunches

# (hidden [T, H], w13 [E, 2I, H], w2 [E, H, I], weights [T, k] float32, ids [T, k], the
# kernel's launch) -> [T, H]; FP8 experts also take w13_scale= and w2_scale= (their 128x128
# block scales).
ExpertsFn = Callable[..., torch.Tensor]
# (router logits [T, E], top_k, renormalize) -> (weights [T, k] float32, ids [T, k] int64)
RouteFn = Callable[[torch.Tensor, int, bool], tuple[torch.Tensor, torch.Tensor]]


def expert_shape(config: ModelConfig) -> ExpertShape:
    return ExpertShape(config.num_experts, config.num_experts_per_tok, config.hidden_size,
                       config.moe_intermediate_size)


def route(logits: torch.Tensor, top_k: int, renormalize: bool
          ) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [T, E] -> (weights [T, k] float32, expert ids [T, k] int64)."""
    probs = torch.softmax(logits.float(), dim=-1)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids


def torch_moe(hidden: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
              weights: torch.Tensor, ids: torch.Tensor,
              launch: MoELaunch | None = None, *, w13_scale: torch.Tensor | None = None,
              w2_scale: torch.Tensor | None = None) -> torch.Tensor:
    """The reference: each hit expert's SwiGLU over its tokens, weighted and summed (it has
    no tiles: `launch` is the kernel's and is not read; FP8 experts with their weights
    dequantized, one expert at a time)."""
    # One row per (token, slot), summed at the end: a token meets each expert at most once.
    out = hidden.new_zeros(*ids.shape, hidden.shape[1])  # [T, k, H]
    inter = w2.shape[2]
    for expert in torch.unique(ids).tolist():
        token_idx, slot = torch.where(ids == expert)
        up_w, down_w = w13[expert], w2[expert]
        if w13_scale is not None and w2_scale is not None:
            up_w = dequantize(up_w, w13_scale[expert]).to(hidden.dtype)
            down_w = dequantize(down_w, w2_scale[expert]).to(hidden.dtype)
        gate_up = F.linear(hidden[token_idx], up_w)  # [n, 2I]
        act = F.silu(gate_up[:, :inter]) * gate_up[:, inter:]
        y = F.linear(act, down_w) * weights[token_idx, slot, None]
        out[token_idx, slot] = y.to(out.dtype)
    return out.sum(dim=1)


def experts_for(device: torch.device) -> ExpertsFn:
    """The fused Triton kernel on CUDA (imported only there: importing it imports triton),
    the torch reference elsewhere."""
    if device.type != "cuda":
        return torch_moe
    from warmgate.server.kernels.fused_moe import fused_moe

    return fused_moe


def routing_for(device: torch.device) -> RouteFn:
    """On CUDA the router's softmax, top-k and renormalisation in one Triton kernel
    (kernels.moe_route), where each torch op would be a launch of its own per layer; the
    torch reference elsewhere."""
    if device.type != "cuda":
        return route
    from warmgate.server.kernels.moe_route import route_topk

    return route_topk


class MoEBlock(nn.Module):
    """A layer's routed experts: [T, H] -> [T, H]."""

    def __init__(self, config: ModelConfig, device: torch.device, dtype: torch.dtype,
                 experts: ExpertsFn | None = None, launches: MoELaunches | None = None,
                 row_wise: bool = False, routing: RouteFn | None = None,
                 fused_router: bool | None = None) -> None:
        if experts is None and device.type == "cuda":  # the kernel will run: fail the load,
            check_moe_kernel_shape(config)  # before any allocation, naming the field
        super().__init__()
        # --deterministic on the CPU: routing and experts one token at a time (the torch
        # reference's GEMM shapes and softmax then never depend on the other tokens).
        self.row_wise = row_wise
        e, h, inter = config.num_experts, config.hidden_size, config.moe_intermediate_size
        self.top_k = config.num_experts_per_tok
        self.renormalize = config.norm_topk_prob
        kw = dict(device=device, dtype=dtype)
        self.router = nn.Parameter(torch.empty(e, h, **kw), requires_grad=False)  # [E, H]
        # FP8 experts (block scales only, config.fp8_config): float8_e4m3fn weights and
        # float32 [E, rows / 128, cols / 128] scales; the router stays in the served dtype.
        fp8 = config.fp8
        wk = kw if fp8 is None else dict(device=device, dtype=FP8_DTYPE)
        # [E, 2I, H]: each expert's gate rows, then its up rows
        self.w13 = nn.Parameter(torch.empty(e, 2 * inter, h, **wk), requires_grad=False)
        self.w2 = nn.Parameter(torch.empty(e, h, inter, **wk), requires_grad=False)  # [E, H, I]
        self.w13_scale: nn.Parameter | None = None
        self.w2_scale: nn.Parameter | None = None
        if fp8 is not None:
            sk = dict(device=device, dtype=torch.float32)
            self.w13_scale = nn.Parameter(torch.empty(e, *scale_shape(fp8, 2 * inter, h), **sk),
                                          requires_grad=False)
            self.w2_scale = nn.Parameter(torch.empty(e, *scale_shape(fp8, h, inter), **sk),
                                         requires_grad=False)
        self.launches = MoELaunches(expert_shape(config)) if launches is None else launches
        self._experts_fn = experts_for(device) if experts is None else experts
        self._route_fn = routing_for(device) if routing is None else routing
        self._fused_router: ModuleType | None = None
        self._router_counts: torch.Tensor | None = None
        if device.type == "cuda" if fused_router is None else fused_router:
            self.fuse_router()
        # A graph break under torch.compile: the reference's loop is data-dependent, the
        # launch is looked up on the host per token-count bucket (state dynamo must not guard),
        # as is whether the router runs fused, and the routing kernels are launched as they
        # are in eager mode.
        self.experts = torch.compiler.disable(self._route_and_run_experts)
        self.normed_experts = torch.compiler.disable(self._norm_route_and_run_experts)

    def fuse_router(self) -> None:
        """Route a few tokens with the router's projection and routing in one launch
        (kernels.moe_router, Triton; on by default on CUDA), on counts of this block's own.
        The module is kept here, not imported per call: every MoE layer of every step routes."""
        from warmgate.server.kernels import moe_router

        self._fused_router = moe_router
        self._router_counts = moe_router.counts_for(self.router.device)

    def _route(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(weights [T, k] float32, expert ids [T, k] int64) of the hidden rows."""
        fused = self._fused_router
        if fused is not None and fused.router_applies(hidden, self.router):
            return fused.router_top_k(hidden, self.router, self._router_counts, self.top_k,
                                      self.renormalize)
        return self._route_fn(F.linear(hidden, self.router), self.top_k, self.renormalize)

    def fuses_norm(self, x: torch.Tensor, residual: torch.Tensor | None,
                   norm_weight: torch.Tensor) -> bool:
        """Whether normed_experts takes these: the fused router is on (CUDA) and takes the
        rows with the norm in front (kernels.moe_router.norm_router_applies)."""
        fused = self._fused_router
        return fused is not None and fused.norm_router_applies(x, residual, norm_weight,
                                                               self.router)

    def _norm_route_and_run_experts(self, x: torch.Tensor, residual: torch.Tensor | None,
                                    norm_weight: torch.Tensor, eps: float
                                    ) -> tuple[torch.Tensor, torch.Tensor]:
        """kernels.rms_norm's RMSNorm of x (the residual added in front), then this block, with
        the norm in the router's launch (fuses_norm said so): (out [T, H], new residual)."""
        assert self._fused_router is not None
        normed, residual, weights, ids = self._fused_router.norm_router_top_k(
            x, residual, norm_weight, eps, self.router, self._router_counts, self.top_k,
            self.renormalize)
        return self._run_experts(normed, weights, ids), residual

    def _route_and_run_experts(self, hidden: torch.Tensor) -> torch.Tensor:
        weights, ids = self._route(hidden)
        return self._run_experts(hidden, weights, ids)

    def _run_experts(self, hidden: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor
                     ) -> torch.Tensor:
        launch = self.launches.launch(hidden.shape[0])
        if self.w13_scale is None:
            return self._experts_fn(hidden, self.w13, self.w2, weights, ids, launch)
        return self._experts_fn(hidden, self.w13, self.w2, weights, ids, launch,
                                w13_scale=self.w13_scale, w2_scale=self.w2_scale)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.row_wise:
            return by_rows(self._route_and_run, hidden)
        return self._route_and_run(hidden)

    def _route_and_run(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.experts(hidden)
