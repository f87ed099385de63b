"""Decode attention on the GPU: the Triton paged kernel against torch SDPA.

    python bench/serve.py kernels [--context 2048] [--capacity 8192]

Every request has `context` cached tokens and one query token (bf16, 32 query heads, 8 KV
heads, block_size 16). SDPA gets the same K/V twice: already dense (its best case, no paging)
and gathered from the paged cache on every call (what a torch paged backend pays). Times are
triton.testing.do_bench medians (eager calls: at small batches the host's launch time shows);
GB/s counts the K/V bytes the triton kernel must read.

A second table (decode_splits_gpu.py) times the kernel in a CUDA graph under the old and the
new split-K rule at batch 1/8/64/128 and context 512/2048, against the card's HBM bandwidth;
a third sweeps the kernel's tile configurations and a fourth its split count at batch 64 and
128.
"""

from __future__ import annotations

import argparse
import sys

import torch
import torch.nn.functional as F

NUM_HEADS, NUM_KV_HEADS, BLOCK_SIZE = 32, 8, 16
BATCHES = (1, 8, 64)
HEAD_DIMS = (64, 128)


def bench_one(batch: int, head_dim: int, context: int) -> dict[str, float]:
    # Imported here so a machine without a GPU (or triton) gets main()'s message, not a trace.
    import triton.testing

    from warmgate.server.kernels import choose_num_splits, paged_attention_decode

    dev, dtype = torch.device("cuda"), torch.bfloat16
    blocks_per_req = -(-context // BLOCK_SIZE)
    num_blocks = 1 + batch * blocks_per_req
    kv_cache = torch.randn(2, num_blocks, BLOCK_SIZE, NUM_KV_HEADS, head_dim, device=dev,
                           dtype=dtype)
    # Shuffled pages, as a long-running server's would be.
    pages = torch.randperm(num_blocks - 1, device=dev).to(torch.int32) + 1
    block_table = pages.view(batch, blocks_per_req)  # [B, blocks_per_req]
    seq_lens = torch.full((batch,), context, dtype=torch.int32, device=dev)
    qsl = torch.arange(batch + 1, dtype=torch.int32, device=dev)
    q = torch.randn(batch, NUM_HEADS, head_dim, device=dev, dtype=dtype)  # [B, Hq, D]
    scale = head_dim ** -0.5
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    splits = choose_num_splits(batch, NUM_KV_HEADS, context, sms)
    out = torch.empty_like(q)

    def run_triton() -> None:
        paged_attention_decode(q, kv_cache, block_table, seq_lens, qsl, scale=scale,
                               query_len=1, num_splits=splits, out=out)

    def gather() -> tuple[torch.Tensor, torch.Tensor]:
        # [B, blocks, bs, Hk, D] -> [B, Hk, L, D]
        k = kv_cache[0][block_table].flatten(1, 2)[:, :context].transpose(1, 2)
        v = kv_cache[1][block_table].flatten(1, 2)[:, :context].transpose(1, 2)
        return k, v

    k_dense, v_dense = (t.contiguous() for t in gather())
    q4 = q.unsqueeze(2)  # [B, Hq, 1, D]

    def run_sdpa_dense() -> None:
        F.scaled_dot_product_attention(q4, k_dense, v_dense, scale=scale, enable_gqa=True)

    def run_sdpa_gather() -> None:
        k, v = gather()
        F.scaled_dot_product_attention(q4, k, v, scale=scale, enable_gqa=True)

    ms = {name: triton.testing.do_bench(fn, return_mode="median")
          for name, fn in (("triton", run_triton), ("sdpa_dense", run_sdpa_dense),
                           ("sdpa_gather", run_sdpa_gather))}
    kv_bytes = 2 * batch * context * NUM_KV_HEADS * head_dim * kv_cache.element_size()
    ms["gbps"] = kv_bytes / (ms["triton"] * 1e-3) / 1e9
    ms["splits"] = splits
    return ms


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--context", type=int, default=2048, help="cached tokens per request")
    p.add_argument("--capacity", type=int, default=8192,
                   help="tokens a request can hold (max_model_len): the split rule's input")
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("kernels_gpu benchmarks the Triton kernels on a CUDA device; none is available",
              file=sys.stderr)
        return 2
    print(f"decode attention, context {args.context}, {NUM_HEADS}/{NUM_KV_HEADS} heads, bf16, "
          "median ms")
    print(f"{'D':>4}{'batch':>6}{'splits':>7}{'triton':>9}{'sdpa':>9}{'sdpa+gather':>12}"
          f"{'triton/sdpa':>12}{'triton/gather':>14}{'GB/s':>8}")
    for head_dim in HEAD_DIMS:
        for batch in BATCHES:
            r = bench_one(batch, head_dim, args.context)
            print(f"{head_dim:>4}{batch:>6}{int(r['splits']):>7}{r['triton']:>9.4f}"
                  f"{r['sdpa_dense']:>9.4f}{r['sdpa_gather']:>12.4f}"
                  f"{r['triton'] / r['sdpa_dense']:>12.2f}"
                  f"{r['triton'] / r['sdpa_gather']:>14.2f}{r['gbps']:>8.0f}")
            torch.cuda.empty_cache()
    # Imports triton: after the check.
    from decode_splits_gpu import print_split_comparison, print_split_sweep, print_tile_sweep

    from warmgate.server.devtools.gpu_card import detect

    card = detect("cuda")
    print(card.describe())
    print_split_comparison(HEAD_DIMS, args.capacity, card.bytes_per_s)
    print_tile_sweep(HEAD_DIMS, args.capacity, card.bytes_per_s)
    print_split_sweep(HEAD_DIMS, args.capacity, card.bytes_per_s)
    return 0


if __name__ == "__main__":
    sys.exit(main())
