"""The fused MoE kernel's row alignment in one launch: what kernels.fused_moe.align_by_expert
computes with about twenty torch ops (a histogram, cumsums, a stable argsort, scatters, a
searchsorted), each a kernel of its own. In a decode step's CUDA graph those run once per MoE
layer, 48 times a step on Qwen3-30B-A3B, whose batch-1 step took 6.0x the time its active
parameters take to read (bench/results/h200-decode-latency-8b-moe.txt): a step of ~1,000 tiny
launches besides the GEMMs. One program does all of it here.

One program walks the (token, slot) rows in chunks, twice: first it counts each expert's rows,
from which each expert's padded run and its start follow; then it places each row at its
expert's cursor plus the number of earlier rows of that expert in the chunk (a cumulative sum
over a chunk x experts one-hot), which keeps rows in their order within an expert, as the torch
version's stable sort does: the outputs are equal element for element. A single program
suits the row counts of decode-sized batches (a few thousand rows); the caller keeps the torch
version for larger ones, where the experts' GEMMs dwarf a few more launches.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from warmgate.server.kernels._launch import pow2

# Elements of a chunk x experts one-hot the program holds at once.
_ONE_HOT_ELEMENTS = 8192


# num_rows and capacity change with the token count: specialised on their divisibility, a new
# batch size could compile another variant after the warmup.
@triton.jit(do_not_specialize=["num_rows", "capacity"])
def _align_kernel(
    ids_ptr, sorted_rows_ptr, tile_experts_ptr, num_padded_ptr,
    num_rows, capacity, num_experts,
    BLOCK_M: tl.constexpr, E_POW2: tl.constexpr, CHUNK: tl.constexpr,
):
    experts = tl.arange(0, E_POW2)
    in_chunk = tl.arange(0, CHUNK)
    counts = tl.zeros((E_POW2,), dtype=tl.int32)
    for r0 in range(0, num_rows, CHUNK):
        r = r0 + in_chunk
        e = tl.load(ids_ptr + r, mask=r < num_rows, other=E_POW2)  # E_POW2: no expert
        counts += tl.sum((e[:, None] == experts[None, :]).to(tl.int32), axis=0)
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    ends = tl.cumsum(padded, axis=0)
    cursor = ends - padded  # each expert's next free slot, from its run's start
    for c0 in range(0, capacity, CHUNK):  # every slot "no row" first
        c = c0 + in_chunk
        tl.store(sorted_rows_ptr + c, tl.full((CHUNK,), 0, tl.int64) + num_rows,
                 mask=c < capacity)
    tl.debug_barrier()  # the placements below overwrite some of those slots
    for r0 in range(0, num_rows, CHUNK):
        r = r0 + in_chunk
        valid = r < num_rows
        e = tl.load(ids_ptr + r, mask=valid, other=E_POW2)
        one_hot = (e[:, None] == experts[None, :]).to(tl.int32)  # [CHUNK, E_POW2]
        earlier = tl.cumsum(one_hot, axis=0) - one_hot  # same-expert rows before, in chunk
        slot = tl.sum((earlier + cursor[None, :]) * one_hot, axis=1)
        tl.store(sorted_rows_ptr + slot, r.to(tl.int64), mask=valid)
        cursor += tl.sum(one_hot, axis=0)
    # Tile t's expert: how many real experts' runs end at or before its first slot (the
    # torch version's searchsorted(ends, t * BLOCK_M, right=True)), the last one past them.
    real = experts < num_experts
    for t0 in range(0, capacity // BLOCK_M, CHUNK):
        t = t0 + in_chunk
        first = (t * BLOCK_M).to(tl.int32)
        before = tl.sum(((ends[None, :] <= first[:, None]) & real[None, :]).to(tl.int32),
                        axis=1)
        tl.store(tile_experts_ptr + t, tl.minimum(before, num_experts - 1).to(tl.int64),
                 mask=t < capacity // BLOCK_M)
    tl.store(num_padded_ptr, tl.sum(padded, axis=0).to(tl.int64))


def aligned_capacity(num_rows: int, num_experts: int, block_m: int) -> int:
    """The rows an alignment holds whatever the routing: every row, and each expert's run
    padded by up to block_m - 1, in whole tiles (no shape depends on the routing)."""
    return triton.cdiv(num_rows + num_experts * (block_m - 1), block_m) * block_m


def align_rows(ids: torch.Tensor, num_experts: int, block_m: int
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """ids [T, k] -> (sorted_rows [R], tile_experts [R / block_m], num_padded [1]), exactly as
    kernels.fused_moe.align_by_expert's torch version returns them (R the worst case)."""
    flat = ids.reshape(-1).contiguous()
    num_rows = flat.numel()
    capacity = aligned_capacity(num_rows, num_experts, block_m)
    sorted_rows = torch.empty(capacity, dtype=torch.int64, device=ids.device)
    tile_experts = torch.empty(capacity // block_m, dtype=torch.int64, device=ids.device)
    num_padded = torch.empty(1, dtype=torch.int64, device=ids.device)
    e_pow2 = pow2(num_experts, 16)
    chunk = max(16, min(256, _ONE_HOT_ELEMENTS // e_pow2))
    _align_kernel[(1,)](flat, sorted_rows, tile_experts, num_padded, num_rows, capacity,
                        num_experts, BLOCK_M=block_m, E_POW2=e_pow2, CHUNK=chunk,
                        num_warps=4)
    return sorted_rows, tile_experts, num_padded
