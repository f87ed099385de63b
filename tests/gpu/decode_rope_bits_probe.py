"""How far the decode kernel that rotates q and k and writes the cache itself lands from
rope_and_cache then the decode kernel, on the GPU, at the GPU test's five head shapes
(tests/gpu/test_decode_rope_gpu.py), over its twenty seeded batches: the numbers its bounds
are set from.

    python -m tests.gpu.decode_rope_bits_probe     # from the repository root, on a GPU

Per shape, the worst over the seeds of: the output's relative error, its share of differing
elements, the cache elements that differ (NaN counted as equal where both are) and the
largest difference in the cache and in the output.
"""

from __future__ import annotations

import sys

import torch


def worst_case(num_heads: int, num_kv_heads: int, head_dim: int, q_len: int, num_splits: int,
               qk_norm: bool) -> str:
    from tests.gpu.test_decode_rope_gpu import CONTEXTS, SEEDS
    from tests.paged_reference import make_paged_batch, rel_err
    from tests.test_decode_rope_kernel import both_paths

    rel = share = cache_max = out_max = 0.0
    cache_differing = 0
    for seed in range(SEEDS):
        batch = make_paged_batch(seed, [q_len] * len(CONTEXTS), CONTEXTS, num_heads,
                                 num_kv_heads, head_dim, 16, torch.bfloat16, "cuda")
        fused, fused_cache, apart, apart_cache = both_paths(batch, q_len, num_splits, qk_norm,
                                                            max_pos=4096)
        fused_cache = fused_cache.nan_to_num(nan=7.0).float()
        apart_cache = apart_cache.nan_to_num(nan=7.0).float()
        rel = max(rel, rel_err(fused, apart))
        share = max(share, (fused != apart).float().mean().item())
        cache_differing = max(cache_differing, int((fused_cache != apart_cache).sum()))
        cache_max = max(cache_max, (fused_cache - apart_cache).abs().max().item())
        out_max = max(out_max, (fused.float() - apart.float()).abs().max().item())
    return (f"case {num_heads},{num_kv_heads},{head_dim},q{q_len},s{num_splits},"
            f"norm={qk_norm}: rel_err {rel:.2e} differing {share:.5f} of {fused.numel()}; "
            f"cache differing {cache_differing} of {fused_cache.numel()} max {cache_max:.2e}; "
            f"out max diff {out_max:.2e}")


def main() -> None:
    if not torch.cuda.is_available():
        # Checked first: without CUDA the tests' modules skip at import.
        sys.exit("decode_rope_bits_probe needs a CUDA device")
    from tests.gpu.test_decode_rope_gpu import CASES

    for case in CASES:
        print(worst_case(*case), flush=True)


if __name__ == "__main__":
    main()
