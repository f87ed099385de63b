"""The Mixture-of-Experts MLP for a few tokens: two GEMV-style kernels, no alignment.

At decode sizes each (token, slot) row meets its expert alone: the grouped path
(kernels.fused_moe) sorts rows by expert into BLOCK_M tiles that are almost all padding,
launches a grid sized for the worst-case padding (num_experts * (BLOCK_M - 1) rows: ~1,400
programs of which ~100 work at one Qwen3-30B-A3B token), and spends an alignment and a slot sum
launch around its GEMMs. Here:

- `_gate_up_kernel`, a program per (slot, BLOCK_N columns of I): the slot's token row times its
  expert's gate and up rows, silu(gate) * up in float32, stored in the model dtype as the
  grouped path stores it ([T k, I]);
- `_down_kernel`, a program per (token, BLOCK_N columns of H): each slot's activation row
  times its expert's down rows, times its routing weight, rounded to the model dtype as the
  grouped path stores each slot's row, then summed over slots 0..k-1 in order in float32 and
  stored once ([T, H]). A fixed order and no atomics: the sum is deterministic.

The programs stream weight tiles along K (the rows are K-contiguous: 16-byte loads) and
multiply them by the broadcast input row in float32: the gate/up kernel two [BLOCK_N, BLOCK_K]
tiles a step, reduced over K once at the end; the down kernel one [k, BLOCK_N, BLOCK_K] tile
of all the token's slots a step (down_block_n). The grids have no dimension for the routing,
so nothing here depends on it but which rows are read, and nothing on the token count but the
grid: one compile serves every forward of the bucket.

FP8 block-scaled experts: BLOCK_K is the 128-wide scale group, and each program quantizes its
input row group by group as kernels.fp8_block_gemm.quantize_groups does (the same amax, scale
and rounding), then applies the activation's and the weights' block scales: the grouped path's
quantization without its two quantize launches.

Expert ids are clamped to [0, num_experts): a padding token's NaN routing names real experts
already (kernels.moe_route), and nothing here may read another expert's memory if it did not.
A NaN row stays in its own token's output.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from warmgate.server.config.fp8_config import FP8_BLOCK, FP8_E4M3_MAX
from warmgate.server.config.moe_kernel import MoELaunch
from warmgate.server.kernels._launch import pow2
from warmgate.server.kernels.fp8_block_gemm import _MIN_SCALE  # quantize_groups' own
from warmgate.server.kernels.pdl import launch_args, pdl_release, pdl_wait


@triton.jit
def _through_e4m3(x, AXIS: tl.constexpr, FP8_MAX: tl.constexpr, MIN_SCALE: tl.constexpr):
    """x (float32, one 128-group along AXIS) quantized as kernels.fp8_block_gemm's
    _group_quant_kernel quantizes it (scale = amax / FP8_MAX, at least MIN_SCALE; the values
    divided, clamped and rounded to e4m3), returned dequantized: its e4m3 values times their
    scale, in float32."""
    scale = tl.maximum(tl.max(tl.abs(x), axis=AXIS, keep_dims=True) / FP8_MAX, MIN_SCALE)
    return tl.clamp(x / scale, -FP8_MAX, FP8_MAX).to(tl.float8e4nv).to(tl.float32) * scale


@triton.jit
def _real_expert(e, num_experts):
    """An expert id clamped to a real expert: nothing is read out of bounds, whatever it is."""
    return tl.minimum(tl.maximum(e, 0), num_experts - 1).to(tl.int64)


@triton.jit
def _gate_up_kernel(
    x_ptr, w_ptr, ids_ptr, act_ptr, w_scale_ptr, num_experts,
    stride_se, stride_sn,
    N: tl.constexpr, K: tl.constexpr, TOP_K: tl.constexpr, BLOCK_SCALED: tl.constexpr,
    GROUP: tl.constexpr, FP8_MAX: tl.constexpr, MIN_SCALE: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, USE_PDL: tl.constexpr,
):
    """act[slot, n] = silu(x[token] . gate[e, n]) * (x[token] . up[e, n]) for one N tile.
    w [E, 2N, K] contiguous (gate rows, then up rows); x [T, K]; act [T TOP_K, N]."""
    slot = tl.program_id(0).to(tl.int64)
    token = slot // TOP_K
    # Which expert's weights to read is the router's output: nothing loads before the wait.
    pdl_wait(USE_PDL)
    pdl_release(USE_PDL)
    expert = _real_expert(tl.load(ids_ptr + slot), num_experts)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    offs_k = tl.arange(0, BLOCK_K)
    gate_ptrs = w_ptr + expert * (2 * N * K) + offs_n[:, None] * K + offs_k[None, :]
    acc_gate = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_mask = offs_k < K - k0
        x = tl.load(x_ptr + token * K + k0 + offs_k, mask=k_mask, other=0.0).to(tl.float32)
        w_mask = n_mask[:, None] & k_mask[None, :]
        gate = tl.load(gate_ptrs + k0, mask=w_mask, other=0.0).to(tl.float32)
        up = tl.load(gate_ptrs + N * K + k0, mask=w_mask, other=0.0).to(tl.float32)
        if BLOCK_SCALED:  # BLOCK_K == GROUP: this tile is one scale group of x and w
            x = _through_e4m3(x, 0, FP8_MAX, MIN_SCALE)
            scales = w_scale_ptr + expert * stride_se + k0 // GROUP
            gate = gate * tl.load(scales + (offs_n // GROUP) * stride_sn, mask=n_mask,
                                  other=0.0)[:, None]
            up = up * tl.load(scales + ((offs_n + N) // GROUP) * stride_sn, mask=n_mask,
                              other=0.0)[:, None]
        acc_gate += gate * x[None, :]
        acc_up += up * x[None, :]
    g = tl.sum(acc_gate, axis=1)
    act = g / (1.0 + tl.exp(-g)) * tl.sum(acc_up, axis=1)
    tl.store(act_ptr + slot * N + offs_n, act.to(act_ptr.dtype.element_ty), mask=n_mask)


@triton.jit
def _down_kernel(
    act_ptr, w_ptr, ids_ptr, weights_ptr, out_ptr, w_scale_ptr, num_experts,
    stride_se, stride_sn,
    N: tl.constexpr, K: tl.constexpr, TOP_K: tl.constexpr, K_POW2: tl.constexpr,
    BLOCK_SCALED: tl.constexpr, GROUP: tl.constexpr, FP8_MAX: tl.constexpr,
    MIN_SCALE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """out[token, n] = sum over slots j in order of weight_j * (act[slot j] . down[e_j, n]).
    w [E, N, K] contiguous; act [T TOP_K, K]; out [T, N].

    Each K step loads the tiles of all the token's slots at once ([K_POW2, BLOCK_N, BLOCK_K]):
    a slot after slot loop would wait on k dependent loads in turn, too few bytes in flight
    for the few programs one token's H columns make."""
    token = tl.program_id(0).to(tl.int64)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    offs_k = tl.arange(0, BLOCK_K)
    slots = tl.arange(0, K_POW2)
    real = slots < TOP_K
    rows = token * TOP_K + slots  # [K_POW2] the token's (token, slot) rows
    pdl_wait(USE_PDL)  # the ids and routing weights are the router's, act the gate/up's
    pdl_release(USE_PDL)
    expert = _real_expert(tl.load(ids_ptr + rows, mask=real, other=0), num_experts)
    w_ptrs = (w_ptr + expert[:, None, None] * (N * K) + offs_n[None, :, None] * K
              + offs_k[None, None, :])
    w_rows = real[:, None] & n_mask[None, :]  # [K_POW2, BLOCK_N]
    acc = tl.zeros((K_POW2, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_mask = offs_k < K - k0
        a = tl.load(act_ptr + rows[:, None] * K + k0 + offs_k[None, :],
                    mask=real[:, None] & k_mask[None, :], other=0.0).to(tl.float32)
        w = tl.load(w_ptrs + k0, mask=w_rows[:, :, None] & k_mask[None, None, :], other=0.0)
        w = w.to(tl.float32)
        if BLOCK_SCALED:  # BLOCK_K == GROUP: each slot's tile is one scale group
            a = _through_e4m3(a, 1, FP8_MAX, MIN_SCALE)
            w = w * tl.load(w_scale_ptr + expert[:, None] * stride_se
                            + (offs_n[None, :] // GROUP) * stride_sn + k0 // GROUP,
                            mask=w_rows, other=0.0)[:, :, None]
        acc += tl.sum(w * a[:, None, :], axis=2)
    weight = tl.load(weights_ptr + rows, mask=real, other=0.0)
    # Each slot's row rounded as the grouped path stores it before its slot sum.
    y = (acc * weight[:, None]).to(out_ptr.dtype.element_ty).to(tl.float32)
    total = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for j in tl.static_range(TOP_K):  # slots 0..k-1 in order (adding the zeros is exact)
        total += tl.sum(tl.where(slots[:, None] == j, y, 0.0), axis=0)
    tl.store(out_ptr + token * N + offs_n, total.to(out_ptr.dtype.element_ty), mask=n_mask)


def down_block_n(launch: MoELaunch, top_k: int) -> int:
    """The down kernel's N tile: its [k, BLOCK_N, BLOCK_K] tile as large as the gate/up
    kernel's two [BLOCK_N, BLOCK_K] ones, so one token's H columns make more programs (H / 4
    of them at Qwen3-30B-A3B's top-8 and the table's BLOCK_N 16)."""
    return max(1, 2 * launch.block_n // pow2(top_k))


def moe_gemv(hidden: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
             weights: torch.Tensor, ids: torch.Tensor, launch: MoELaunch,
             w13_scale: torch.Tensor | None = None, w2_scale: torch.Tensor | None = None
             ) -> torch.Tensor:
    """kernels.fused_moe.fused_moe's result for a few tokens, in two launches. hidden, w13,
    w2 contiguous; weights [T k] float32 and ids [T, k] contiguous. `launch`: block_n the
    gate/up kernel's N tile (the down kernel's: down_block_n), block_k the K tile (FP8: the
    scale group), num_warps and num_stages both kernels'; block_m is not read."""
    num_tokens, top_k = ids.shape
    num_experts, hidden_size, inter = w2.shape
    act = torch.empty(num_tokens * top_k, inter, dtype=hidden.dtype, device=hidden.device)
    out = torch.empty(num_tokens, hidden_size, dtype=hidden.dtype, device=hidden.device)
    scaled = w13_scale is not None and w2_scale is not None
    s13 = w13_scale.contiguous() if w13_scale is not None else weights  # unread unless scaled
    s2 = w2_scale.contiguous() if w2_scale is not None else weights
    common = dict(TOP_K=top_k, BLOCK_SCALED=scaled, GROUP=FP8_BLOCK, FP8_MAX=FP8_E4M3_MAX,
                  MIN_SCALE=_MIN_SCALE, BLOCK_K=FP8_BLOCK if scaled else launch.block_k,
                  num_warps=launch.num_warps, num_stages=launch.num_stages,
                  **launch_args(hidden))
    block_n = launch.block_n
    _gate_up_kernel[(num_tokens * top_k, triton.cdiv(inter, block_n))](
        hidden, w13, ids, act, s13, num_experts,
        s13.stride(0) if scaled else 0, s13.stride(1) if scaled else 0,
        N=inter, K=hidden_size, BLOCK_N=block_n, **common)
    block_n = down_block_n(launch, top_k)
    _down_kernel[(num_tokens, triton.cdiv(hidden_size, block_n))](
        act, w2, ids, weights, out, s2, num_experts,
        s2.stride(0) if scaled else 0, s2.stride(1) if scaled else 0,
        N=hidden_size, K=inter, K_POW2=pow2(top_k), BLOCK_N=block_n, **common)
    return out
