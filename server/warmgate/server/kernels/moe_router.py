"""The MoE router for a few tokens in one launch: the router projection (hidden [T, H] @ the
router weight [E, H]^T), then kernels.moe_route's softmax, top-k and renormalisation.

At decode sizes the two launches it replaces are mostly latency: cuBLAS spent about 5 us on a
[1, 2048] x [2048, 128] product (a 0.5 MB read), the routing kernel 2 us, and a decode step's
CUDA graph waits a launch gap before each (48 layers of both, about 0.35 ms of a 4.7 ms step:
run 26 in bench/results/README.md). Here the projection is spread over programs of BLOCK_E
experts by BLOCK_K columns (one tile each), each storing its float32 partial logits; the last
program of a token to finish (an atomic count per token) adds the token's partials in split
order, rounds the logits to the model dtype as F.linear returns them, and routes. With the
layer's RMSNorm in front (norm_router_top_k), every program normalises its token's row first
and the token's first program stores it for the experts: the rms_norm launch goes too.

- Deterministic: the partials are added in a fixed order whatever order the programs ran in,
  and a token's result never depends on the other tokens (a batch-invariant router).
- The count: one int32 per token row, zero before the launch; the last program sets it back to
  zero, so a captured graph replays the launch with no memset of its own. The caller keeps the
  buffer (one per MoE layer: runner.moe.MoEBlock), `counts_for` allocates it.
- Ordering: each program's atomic add is a release of its partials and the last program's an
  acquire, and the last program reads the partials with volatile loads (never from a stale
  L1 line of an earlier replay).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from warmgate.server.kernels._launch import pow2
from warmgate.server.kernels._row_norm import normed_tile, residual_sum, rstd_of
from warmgate.server.kernels.moe_route import store_top_k, top_k_of
from warmgate.server.kernels.pdl import launch_args, pdl_release, pdl_wait

# The most tokens a launch routes (decode steps of a few streams): each token's programs
# reread the router weight (from L2), so past a handful of tokens cuBLAS's one read wins.
MAX_TOKENS = 8
# Experts per program: a one-row program streams BLOCK_E weight rows, as kernels.dense_gemv.
BLOCK_E = 4
# Bytes of a weight row a program's split covers, in one load: a router weight of 0.5 MB
# (Qwen3-30B-A3B's 128 x 2048) spreads over about one program per SM.
SPLIT_BYTES = 1024


def counts_for(device: torch.device) -> torch.Tensor:
    """A zeroed count buffer for router_top_k's launches on `device`."""
    return torch.zeros(MAX_TOKENS, dtype=torch.int32, device=device)


@triton.jit(do_not_specialize=["num_tokens", "eps"])
def _router_kernel(
    x_ptr, w_ptr, partial_ptr, counts_ptr, weights_ptr, ids_ptr, num_tokens, num_experts,
    res_ptr, norm_w_ptr, normed_ptr, res_out_ptr, eps,
    K: tl.constexpr, SPLITS: tl.constexpr, BLOCK_E: tl.constexpr,
    BLOCK_K: tl.constexpr, TOP_K: tl.constexpr, K_POW2: tl.constexpr, E_POW2: tl.constexpr,
    RENORMALIZE: tl.constexpr, NORM: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
    BLOCK_H: tl.constexpr, USE_PDL: tl.constexpr,
):
    """Grid (T, expert tiles, SPLITS): a program's split is one [BLOCK_E, BLOCK_K] tile of the
    router weight. x [T, K], w [E, K] contiguous; partial [SPLITS, T, E] float32; counts
    [>= T] int32, zero; weights [T, TOP_K] float32, ids [T, TOP_K] int64.
    NORM: the router's input is rms_norm(x (+ res), norm_w, eps) (kernels/_row_norm.py,
    BLOCK_H: K's power of two), which the token's program (token, 0, 0) stores to normed
    [T, K] (the experts' input), with the residual sum to res_out [T, K]."""
    token = tl.program_id(0).to(tl.int64)
    split = tl.program_id(2)
    offs_e = tl.program_id(1) * BLOCK_E + tl.arange(0, BLOCK_E)
    e_mask = offs_e < num_experts
    ks = split * BLOCK_K + tl.arange(0, BLOCK_K)
    k_mask = ks < K
    row = token * K
    # The router weight is no kernel's output: its tile is read first, while the previous
    # kernel finishes (PDL) and while the norm below takes the row's sum of squares.
    w = tl.load(w_ptr + offs_e.to(tl.int64)[:, None] * K + ks[None, :],
                mask=e_mask[:, None] & k_mask[None, :], other=0.0)
    pdl_wait(USE_PDL)  # x is the previous kernel's output
    pdl_release(USE_PDL)
    if NORM:
        offs_h = tl.arange(0, BLOCK_H)
        h_mask = offs_h < K
        h = residual_sum(x_ptr + row, res_ptr + row, offs_h, h_mask, HAS_RESIDUAL)
        rstd = rstd_of(tl.sum(h * h, axis=0), K, eps)
        if (tl.program_id(1) == 0) & (split == 0):
            dtype = normed_ptr.dtype.element_ty
            if HAS_RESIDUAL:
                tl.store(res_out_ptr + row + offs_h, h.to(dtype), mask=h_mask)
            norm_w = tl.load(norm_w_ptr + offs_h, mask=h_mask, other=0.0).to(tl.float32)
            tl.store(normed_ptr + row + offs_h, (h * rstd * norm_w).to(dtype), mask=h_mask)
        x = normed_tile(x_ptr + row, res_ptr + row, norm_w_ptr, ks, k_mask, rstd,
                        HAS_RESIDUAL).to(tl.float32)
    else:
        x = tl.load(x_ptr + row + ks, mask=k_mask, other=0.0).to(tl.float32)
    tl.store(partial_ptr + (split * num_tokens + token) * num_experts + offs_e,
             tl.sum(w.to(tl.float32) * x[None, :], axis=1), mask=e_mask)
    programs = tl.num_programs(1) * tl.num_programs(2)
    finished = tl.atomic_add(counts_ptr + token, 1, sem="acq_rel")
    if finished == programs - 1:  # every partial of this token is stored: route it
        tl.store(counts_ptr + token, 0)
        experts = tl.arange(0, E_POW2)
        real = experts < num_experts
        logits = tl.zeros((E_POW2,), dtype=tl.float32)
        for s in range(SPLITS):
            logits += tl.load(partial_ptr + (s * num_tokens + token) * num_experts + experts,
                              mask=real, other=0.0, volatile=True)
        # F.linear's logits are in the model dtype: the softmax sees them rounded so.
        logits = logits.to(x_ptr.dtype.element_ty).to(tl.float32)
        top_w, top_i = top_k_of(logits, experts, real, TOP_K, K_POW2, E_POW2, RENORMALIZE)
        store_top_k(weights_ptr, ids_ptr, token, top_w, top_i, TOP_K, K_POW2)


def router_applies(hidden: torch.Tensor, router: torch.Tensor) -> bool:
    """Whether router_top_k takes these: 1..MAX_TOKENS contiguous rows in the router's dtype."""
    return (hidden.dim() == 2 and 1 <= hidden.shape[0] <= MAX_TOKENS
            and hidden.dtype == router.dtype and hidden.shape[1] == router.shape[1]
            and hidden.is_contiguous() and router.is_contiguous())


def norm_router_applies(x: torch.Tensor, residual: torch.Tensor | None,
                        norm_weight: torch.Tensor, router: torch.Tensor) -> bool:
    """Whether norm_router_top_k takes these: router_applies' rows, a residual of their shape
    and dtype (or none) and a contiguous norm weight [H] of their dtype."""
    return (router_applies(x, router)
            and (residual is None or (residual.shape == x.shape and residual.dtype == x.dtype
                                      and residual.is_contiguous()))
            and norm_weight.shape == (x.shape[1],) and norm_weight.dtype == x.dtype
            and norm_weight.is_contiguous())


def router_top_k(hidden: torch.Tensor, router: torch.Tensor, counts: torch.Tensor,
                 top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """runner.moe.route(F.linear(hidden, router), top_k, renormalize) in one launch: hidden
    [T, H] (T <= MAX_TOKENS), router [E, H], counts from counts_for (left zero) -> (weights
    [T, k] float32, expert ids [T, k] int64)."""
    if not router_applies(hidden, router):
        raise ValueError(f"router_top_k: hidden {tuple(hidden.shape)} {hidden.dtype}, router "
                         f"{tuple(router.shape)} {router.dtype}: not 1..{MAX_TOKENS} contiguous "
                         "rows of the router's width and dtype")
    return _launch(hidden, router, counts, top_k, renormalize, None)


def norm_router_top_k(x: torch.Tensor, residual: torch.Tensor | None,
                      norm_weight: torch.Tensor, eps: float, router: torch.Tensor,
                      counts: torch.Tensor, top_k: int, renormalize: bool
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """kernels.rms_norm.rms_norm(x, norm_weight, eps, residual), then router_top_k on its
    output, in the one launch: (normed [T, H], new residual [T, H] (x itself without one),
    weights, ids). Every program normalises its token's row itself; the normalised rows and
    the residual are rms_norm's arithmetic (the residual to the bit, the normalised values
    within an ulp where the sum of squares adds in another order)."""
    if not norm_router_applies(x, residual, norm_weight, router):
        raise ValueError(f"norm_router_top_k: x {tuple(x.shape)} {x.dtype}, residual "
                         f"{None if residual is None else tuple(residual.shape)}, norm weight "
                         f"{tuple(norm_weight.shape)}, router {tuple(router.shape)}: not "
                         f"1..{MAX_TOKENS} contiguous rows with a norm weight of their width")
    normed = torch.empty_like(x)
    res_out = x if residual is None else torch.empty_like(x)
    weights, ids = _launch(x, router, counts, top_k, renormalize,
                           (residual, norm_weight, eps, normed, res_out))
    return normed, res_out, weights, ids


def _launch(x: torch.Tensor, router: torch.Tensor, counts: torch.Tensor, top_k: int,
            renormalize: bool,
            norm: tuple[torch.Tensor | None, torch.Tensor, float, torch.Tensor, torch.Tensor]
            | None) -> tuple[torch.Tensor, torch.Tensor]:
    num_tokens, k = x.shape
    num_experts = router.shape[0]
    block_k = min(SPLIT_BYTES // x.element_size(), pow2(k, 16))
    splits = triton.cdiv(k, block_k)
    partial = torch.empty(splits, num_tokens, num_experts, dtype=torch.float32,
                          device=x.device)
    weights = torch.empty(num_tokens, top_k, dtype=torch.float32, device=x.device)
    ids = torch.empty(num_tokens, top_k, dtype=torch.int64, device=x.device)
    # Without a norm its arguments are unread stand-ins (x); without a residual, two of them.
    residual, norm_weight, eps, normed, res_out = norm or (None, x, 0.0, x, x)
    grid = (num_tokens, triton.cdiv(num_experts, BLOCK_E), splits)
    _router_kernel[grid](x, router, partial, counts, weights, ids, num_tokens, num_experts,
                         x if residual is None else residual, norm_weight, normed, res_out, eps,
                         K=k, SPLITS=splits, BLOCK_E=BLOCK_E,
                         BLOCK_K=block_k, TOP_K=top_k, K_POW2=pow2(top_k),
                         E_POW2=pow2(num_experts, 16), RENORMALIZE=renormalize,
                         NORM=norm is not None, HAS_RESIDUAL=residual is not None,
                         BLOCK_H=pow2(k, 16) if norm is not None else 16, num_warps=4,
                         **launch_args(x))
    return weights, ids
