"""The Mixture-of-Experts MLP as two grouped GEMMs over tokens sorted by expert.

Each (token, slot) pair the router picked is one row of work. `align_by_expert` sorts the rows
by expert and pads every expert's run to a multiple of BLOCK_M, so each BLOCK_M tile of the
sorted order belongs to exactly one expert: a program multiplies its tile by that expert's
weights alone. The first GEMM reads each row's token from the hidden states and computes the
expert's gate and up columns together, storing silu(gate) * up (SwiGLU fused, no [rows, 2I]
intermediate); the second multiplies by the expert's down projection and by the row's routing
weight; the k rows of a token are then summed. Everything is fixed-shape and host-sync free
(the padding is sized for the worst case, tiles past the real end return at once), so a
forward with it can be captured in a CUDA graph.

A forward of a few tokens (a per-slot launch: config.moe_kernel.GEMV_MAX_TOKENS) takes
kernels.moe_gemv instead, two kernels with no alignment and a grid of the rows' real work.

The launch configuration (BLOCK_M/N/K, warps, stages) depends on the token count; the caller
passes the one its token-count bucket holds (runner.moe_launches: a table fitted to the expert
shape, or a warmup autotune's winner kept in the compile cache), so serving never autotunes
and the kernels a forward can launch are exactly one per bucket and GEMM (what a warmup must
compile). Without one, the table's is used.
"""

from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl

from warmgate.server.config.fp8_config import FP8_BLOCK
from warmgate.server.config.moe_kernel import (  # noqa: F401 (re-exported)
    LAUNCH_TABLE,
    MoELaunch,
    bucket_of,
    launch_for,
    token_buckets,
)
from warmgate.server.kernels._launch import elementwise_warps, ieee_dots, pow2, upcast_dots
from warmgate.server.kernels.fp8_block_gemm import quantize_groups
from warmgate.server.kernels.moe_align import align_rows, aligned_capacity
from warmgate.server.kernels.moe_gemv import moe_gemv

# Token-count buckets up to this one align their rows in one kernel (kernels.moe_align);
# larger ones with torch ops, whose few launches cost nothing beside those batches' GEMMs.
# Decided per bucket, not per token count, so each bucket's one warmup run compiles all the
# kernels any token count in it launches.
ALIGN_KERNEL_MAX_BUCKET = 256


def align_by_expert(ids: torch.Tensor, num_experts: int, block_m: int
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """ids [T, k] -> (sorted_rows [R], tile_experts [R / block_m], num_padded [1]).

    sorted_rows lists the flat (token * k + slot) rows expert by expert, each expert's run
    padded to a multiple of block_m with T * k (no row); tile_experts is each tile's expert;
    num_padded the padded length actually used. R is the worst case, so no shape depends on
    the routing."""
    if bucket_of(ids.shape[0]) <= ALIGN_KERNEL_MAX_BUCKET:
        return align_rows(ids, num_experts, block_m)
    return align_by_expert_torch(ids, num_experts, block_m)


def align_by_expert_torch(ids: torch.Tensor, num_experts: int, block_m: int
                          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """align_by_expert in torch ops (a stable argsort), for batches past the kernel's."""
    flat = ids.reshape(-1)
    num_rows = flat.numel()
    counts = torch.zeros(num_experts, dtype=torch.int64, device=ids.device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block_m - 1) // block_m * block_m
    ends = torch.cumsum(padded, 0)
    starts = ends - padded
    order = torch.argsort(flat, stable=True)  # rows grouped by expert, in row order
    experts_sorted = flat[order]
    rank = (torch.arange(num_rows, device=ids.device)
            - (torch.cumsum(counts, 0) - counts)[experts_sorted])
    capacity = aligned_capacity(num_rows, num_experts, block_m)
    sorted_rows = torch.full((capacity,), num_rows, dtype=torch.int64, device=ids.device)
    sorted_rows[starts[experts_sorted] + rank] = order
    tile_starts = torch.arange(0, capacity, block_m, device=ids.device)
    tile_experts = torch.searchsorted(ends, tile_starts, right=True).clamp_(max=num_experts - 1)
    return sorted_rows, tile_experts, ends[-1:]


# num_rows (tokens * k) changes with every batch: specialised on divisibility by 16 as Triton
# does by default, a new token count could compile a second variant after the warmup.
@triton.jit(do_not_specialize=["num_rows"])
def _grouped_gemm_kernel(
    a_ptr, b_ptr, c_ptr, weights_ptr, sorted_rows_ptr, tile_experts_ptr, num_padded_ptr,
    a_scale_ptr, b_scale_ptr,
    N, K, num_rows,
    stride_am, stride_be, stride_bn, stride_cm,
    stride_asm, stride_bse, stride_bsn,
    TOP_K: tl.constexpr, GATED: tl.constexpr, MUL_WEIGHT: tl.constexpr,
    UPCAST: tl.constexpr, IEEE: tl.constexpr, BLOCK_SCALED: tl.constexpr,
    GROUP: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """One BLOCK_M x BLOCK_N tile of c = a[rows] @ b[expert]^T for one expert's rows.

    GATED: a's row is the token (row // TOP_K), b holds N gate rows then N up rows, and the
    tile stored is silu(gate) * up. Otherwise a's row is the row itself. MUL_WEIGHT scales
    each row by its routing weight. Rows are stored at their own index in c.
    BLOCK_SCALED: a and b are FP8, a with one scale per row and GROUP-wide group of K
    (a_scale [rows of a, K / GROUP]), b with one per GROUP x GROUP block (b_scale
    [E, N' / GROUP, K / GROUP]); every K tile lies in one group, so each tile's partial
    product is scaled as it is accumulated."""
    pid = tl.program_id(0)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    pid_m = pid // num_pid_n
    pid_n = pid % num_pid_n
    if pid_m * BLOCK_M >= tl.load(num_padded_ptr):
        return
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rows = tl.load(sorted_rows_ptr + offs_m)
    valid = rows < num_rows
    a_rows = rows // TOP_K if GATED else rows
    expert = tl.load(tile_experts_ptr + pid_m).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + a_rows[:, None] * stride_am + offs_k[None, :]
    b_ptrs = b_ptr + expert * stride_be + offs_n[None, :] * stride_bn + offs_k[:, None]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if BLOCK_SCALED:
        a_scale_ptrs = a_scale_ptr + a_rows.to(tl.int64) * stride_asm
        b_scale_ptrs = b_scale_ptr + expert * stride_bse + (offs_n // GROUP) * stride_bsn
    for k0 in range(0, tl.cdiv(K, BLOCK_K)):
        k_mask = offs_k < K - k0 * BLOCK_K
        a = tl.load(a_ptrs, mask=valid[:, None] & k_mask[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=k_mask[:, None] & n_mask[None, :], other=0.0)
        if UPCAST:
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        if IEEE:  # noqa: SIM108 (the static branch the other tl.dot calls use)
            part = tl.dot(a, b, input_precision="ieee")
        else:
            part = tl.dot(a, b)
        if BLOCK_SCALED:
            group = (k0 * BLOCK_K) // GROUP
            a_s = tl.load(a_scale_ptrs + group, mask=valid, other=0.0)[:, None]
            part = part * a_s * tl.load(b_scale_ptrs + group, mask=n_mask, other=0.0)[None, :]
        acc += part
        if GATED:
            up = tl.load(b_ptrs + N * stride_bn, mask=k_mask[:, None] & n_mask[None, :],
                         other=0.0)
            if UPCAST:
                up = up.to(tl.float32)
            if IEEE:  # noqa: SIM108 (as above)
                part = tl.dot(a, up, input_precision="ieee")
            else:
                part = tl.dot(a, up)
            if BLOCK_SCALED:
                part = part * a_s * tl.load(b_scale_ptrs + (N // GROUP) * stride_bsn + group,
                                            mask=n_mask, other=0.0)[None, :]
            acc_up += part
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K
    if GATED:
        acc = acc / (1.0 + tl.exp(-acc)) * acc_up
    if MUL_WEIGHT:
        acc = acc * tl.load(weights_ptr + rows, mask=valid, other=0.0)[:, None]
    c_ptrs = c_ptr + rows[:, None] * stride_cm + offs_n[None, :]
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=valid[:, None] & n_mask[None, :])


def _grouped_gemm(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, weights: torch.Tensor,
                  aligned: tuple[torch.Tensor, torch.Tensor, torch.Tensor], top_k: int,
                  gated: bool, launch: MoELaunch,
                  scales: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
    """scales: (a's per-row-and-group scales, b's block scales) when a and b are FP8."""
    sorted_rows, tile_experts, num_padded = aligned
    n = c.shape[1]
    grid = (tile_experts.shape[0] * triton.cdiv(n, launch.block_n),)
    a_scale, b_scale = scales if scales is not None else (weights, weights)  # unread
    scaled = scales is not None
    _grouped_gemm_kernel[grid](
        a, b, c, weights, sorted_rows, tile_experts, num_padded, a_scale, b_scale,
        n, a.shape[1], c.shape[0],
        a.stride(0), b.stride(0), b.stride(1), c.stride(0),
        a_scale.stride(0) if scaled else 0, b_scale.stride(0) if scaled else 0,
        b_scale.stride(1) if scaled else 0,
        TOP_K=top_k, GATED=gated, MUL_WEIGHT=not gated,
        UPCAST=upcast_dots(a), IEEE=ieee_dots(a.dtype), BLOCK_SCALED=scaled,
        GROUP=FP8_BLOCK,
        BLOCK_M=launch.block_m, BLOCK_N=launch.block_n, BLOCK_K=launch.block_k,
        num_warps=launch.num_warps, num_stages=launch.num_stages)


def fused_moe(hidden: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
              weights: torch.Tensor, ids: torch.Tensor,
              launch: MoELaunch | None = None, *, w13_scale: torch.Tensor | None = None,
              w2_scale: torch.Tensor | None = None) -> torch.Tensor:
    """hidden [T, H], w13 [E, 2I, H] (gate rows, then up rows), w2 [E, H, I], weights [T, k]
    (float32), ids [T, k] -> [T, H]: sum over k of weight * down(silu(gate) * up), each row
    through its own expert. `launch` overrides the table's (tests cross tile edges with it).
    With w13_scale [E, 2I/128, ceil(H/128)] and w2_scale [E, ceil(H/128), ceil(I/128)] the
    experts are block-scaled FP8 and each GEMM's input is quantized per token and 128-group
    first (kernels.fp8_block_gemm.quantize_groups)."""
    num_tokens, top_k = ids.shape
    num_experts, hidden_size, inter = w2.shape
    if w13.shape != (num_experts, 2 * inter, hidden_size) or hidden.shape[1] != hidden_size:
        raise ValueError(f"fused_moe: hidden {tuple(hidden.shape)}, w13 {tuple(w13.shape)} and "
                         f"w2 {tuple(w2.shape)} do not fit together")
    if num_tokens == 0:
        return hidden.new_zeros(0, hidden_size)
    launch = launch_for(num_tokens) if launch is None else launch
    hidden, w13, w2 = hidden.contiguous(), w13.contiguous(), w2.contiguous()
    weights = weights.reshape(-1).float().contiguous()
    if launch.per_slot:  # a few tokens: two GEMV-style kernels, no alignment (moe_gemv)
        return moe_gemv(hidden, w13, w2, weights, ids.contiguous(), launch,
                        w13_scale=w13_scale, w2_scale=w2_scale)
    aligned = align_by_expert(ids, num_experts, launch.block_m)
    rows = num_tokens * top_k
    act = torch.empty(rows, inter, dtype=hidden.dtype, device=hidden.device)  # [T k, I]
    out = torch.empty(rows, hidden_size, dtype=hidden.dtype, device=hidden.device)
    if w13_scale is not None and w2_scale is not None:
        if launch.block_k not in (32, 64, FP8_BLOCK):  # inside one scale group; FP8 dots
            launch = dataclasses.replace(launch, block_k=FP8_BLOCK)  # take K >= 32
        hq, h_scale = quantize_groups(hidden)
        _grouped_gemm(hq, w13, act, weights, aligned, top_k, True, launch,
                      (h_scale, w13_scale.contiguous()))
        aq, a_scale = quantize_groups(act)
        _grouped_gemm(aq, w2, out, weights, aligned, top_k, False, launch,
                      (a_scale, w2_scale.contiguous()))
    else:
        _grouped_gemm(hidden, w13, act, weights, aligned, top_k, True, launch)
        _grouped_gemm(act, w2, out, weights, aligned, top_k, False, launch)
    return sum_slots(out.view(num_tokens, top_k, hidden_size))


@triton.jit
def _sum_slots_kernel(x_ptr, out_ptr, hidden, TOP_K: tl.constexpr, K_POW2: tl.constexpr,
                      BLOCK_H: tl.constexpr):
    token = tl.program_id(0).to(tl.int64)
    offs_h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    slots = tl.arange(0, K_POW2)
    mask = (slots[:, None] < TOP_K) & (offs_h[None, :] < hidden)
    rows = tl.load(x_ptr + (token * TOP_K + slots[:, None]) * hidden + offs_h[None, :],
                   mask=mask, other=0.0).to(tl.float32)  # [K_POW2, BLOCK_H]
    tl.store(out_ptr + token * hidden + offs_h, tl.sum(rows, axis=0).to(
        out_ptr.dtype.element_ty), mask=offs_h < hidden)


def sum_slots(rows: torch.Tensor) -> torch.Tensor:
    """rows [T, k, H] (contiguous) -> [T, H] in their dtype: each token's k rows summed in
    float32, as the reference accumulates them, in one launch (a float cast, a sum and a cast
    back would be three, per MoE layer of a decode step's graph)."""
    num_tokens, top_k, hidden = rows.shape
    out = torch.empty(num_tokens, hidden, dtype=rows.dtype, device=rows.device)
    block_h = min(pow2(hidden, 16), 1024)
    _sum_slots_kernel[(num_tokens, triton.cdiv(hidden, block_h))](
        rows, out, hidden, TOP_K=top_k, K_POW2=pow2(top_k), BLOCK_H=block_h,
        num_warps=elementwise_warps(block_h))
    return out
