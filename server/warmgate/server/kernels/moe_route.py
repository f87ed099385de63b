"""The MoE router's softmax, top-k and renormalisation in one launch per step: what
runner.moe.route computes with five torch ops (a float cast, the softmax, topk, and the sum and
division of renormalising), each a kernel of its own once per MoE layer in a decode step's
CUDA graph. One program per token: the softmax over all experts in float32, the top k by k
passes of argmax (the largest first, the lower expert id first on a tie, as torch.topk returns
them), then the k weights renormalised to sum to 1 when the architecture says so.

A token whose logits hold a NaN or an infinity has no probabilities (NaN all along, as the
torch softmax gives): its weights are NaN, as torch's are, and its experts the lowest ids, so
that every id names a real expert. Such tokens are real: the rows of a captured graph's
padding tokens, which no request owns, hold whatever their buffers held, and the rows'
alignment by expert indexes with every id (one past the last expert made it write out of
bounds).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from warmgate.server.kernels._launch import pow2, unit_stride_last
from warmgate.server.kernels.pdl import launch_args, pdl_release, pdl_wait


@triton.jit
def top_k_of(x, experts, real, TOP_K: tl.constexpr, K_POW2: tl.constexpr,
             E_POW2: tl.constexpr, RENORMALIZE: tl.constexpr):
    """One token's routing from its float32 logits x [E_POW2] (experts = arange(E_POW2), real
    = experts < num_experts): (weights [K_POW2] float32, ids [K_POW2] int32), slots past
    TOP_K holding zeros. Shared by this module's kernel and kernels.moe_router's."""
    x = tl.where(real, x, float("-inf"))
    p = tl.exp(x - tl.max(x, axis=0))
    p = p / tl.sum(p, axis=0)
    p = tl.where(real, p, -1.0)  # below every probability: never picked
    p = tl.where(p == p, p, -0.5)  # NaN: above the unreal and the picked, below any number
    slots = tl.arange(0, K_POW2)
    top_w = tl.zeros((K_POW2,), dtype=tl.float32)
    top_i = tl.zeros((K_POW2,), dtype=tl.int32)
    for j in tl.static_range(TOP_K):
        best = tl.max(p, axis=0)
        pick = tl.min(tl.where(p == best, experts, E_POW2), axis=0)  # the lowest id on a tie
        top_w = tl.where(slots == j, tl.where(best >= 0.0, best, float("nan")), top_w)
        top_i = tl.where(slots == j, pick, top_i)
        p = tl.where(experts == pick, -1.0, p)
    if RENORMALIZE:
        top_w = top_w / tl.sum(top_w, axis=0)  # slots past TOP_K hold 0
    return top_w, top_i


@triton.jit
def store_top_k(weights_ptr, ids_ptr, token, top_w, top_i, TOP_K: tl.constexpr,
                K_POW2: tl.constexpr):
    """The token's k weights and int64 ids at row `token` of [T, TOP_K]."""
    slots = tl.arange(0, K_POW2)
    out = token * TOP_K + slots
    tl.store(weights_ptr + out, top_w, mask=slots < TOP_K)
    tl.store(ids_ptr + out, top_i.to(tl.int64), mask=slots < TOP_K)


@triton.jit
def _route_kernel(
    logits_ptr, weights_ptr, ids_ptr, stride_t, num_experts,
    TOP_K: tl.constexpr, K_POW2: tl.constexpr, E_POW2: tl.constexpr,
    RENORMALIZE: tl.constexpr, USE_PDL: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    experts = tl.arange(0, E_POW2)
    real = experts < num_experts
    pdl_wait(USE_PDL)  # the logits are the router projection's output
    x = tl.load(logits_ptr + token * stride_t + experts, mask=real,
                other=float("-inf")).to(tl.float32)
    pdl_release(USE_PDL)
    top_w, top_i = top_k_of(x, experts, real, TOP_K, K_POW2, E_POW2, RENORMALIZE)
    store_top_k(weights_ptr, ids_ptr, token, top_w, top_i, TOP_K, K_POW2)


def route_topk(logits: torch.Tensor, top_k: int, renormalize: bool
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [T, E] -> (weights [T, k] float32, expert ids [T, k] int64), as runner.moe.route."""
    x = unit_stride_last(logits)
    num_tokens, num_experts = x.shape
    weights = torch.empty(num_tokens, top_k, dtype=torch.float32, device=x.device)
    ids = torch.empty(num_tokens, top_k, dtype=torch.int64, device=x.device)
    if num_tokens:
        _route_kernel[(num_tokens,)](x, weights, ids, x.stride(0), num_experts, TOP_K=top_k,
                                     K_POW2=pow2(top_k), E_POW2=pow2(num_experts, 16),
                                     RENORMALIZE=renormalize, num_warps=1, **launch_args(x))
    return weights, ids
