"""The decode kernel that rotates q and k and writes the cache itself, compiled for the GPU at
the served models' head shapes, against rope_and_cache then the decode kernel, over many
launches. Every cache slot this step writes starts as NaN, so a program that read one of them
back before its threads had written it (the barrier in kernels/_decode_rope.py) would give NaN
somewhere in the output. The cache must be the same bits. The outputs are not always: on an
H100 14 of 49,152 elements differed by one bf16 ulp, at contexts of 511 keys and more
(bench/results/h100-decode-rope-bits.txt), so they are held to a relative error and a share of
differing elements a rounding can explain.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from triton.runtime.interpreter import InterpretedFunction

from tests.paged_reference import make_paged_batch, rel_err
from tests.test_decode_rope_kernel import both_paths
from warmgate.server.kernels.decode_attention import _decode_kernel

# Without CUDA, tests/gpu/conftest.py skips every test here.
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(
    isinstance(_decode_kernel, InterpretedFunction),
    reason="TRITON_INTERPRET=1 is set: unset it to test the compiled kernels")]

CASES = [
    # num_heads, num_kv_heads, head_dim, q_len, num_splits, qk_norm: the 8B, the 1B, Qwen3-MoE
    (32, 8, 128, 1, 16, False),
    (32, 8, 128, 4, 4, False),
    (32, 8, 64, 1, 1, False),
    (32, 4, 128, 1, 16, True),
    (32, 4, 128, 4, 8, True),
]


@pytest.mark.parametrize(("num_heads", "num_kv_heads", "head_dim", "q_len", "num_splits",
                          "qk_norm"), CASES)
def test_the_fused_decode_gives_the_two_launches_bits(num_heads: int, num_kv_heads: int,
                                                      head_dim: int, q_len: int,
                                                      num_splits: int, qk_norm: bool) -> None:
    contexts = [0, 1, 15, 16, 63, 64, 65, 200, 511, 1000, 1500, 2000]
    for seed in range(20):
        batch = make_paged_batch(seed, [q_len] * len(contexts), contexts, num_heads,
                                 num_kv_heads, head_dim, 16, torch.bfloat16, "cuda")
        fused, fused_cache, apart, apart_cache = both_paths(batch, q_len, num_splits, qk_norm,
                                                            max_pos=4096)
        assert torch.isfinite(fused).all(), seed
        assert torch.equal(fused_cache.nan_to_num(nan=7.0), apart_cache.nan_to_num(nan=7.0))
        assert rel_err(fused, apart) <= 1e-3, seed
        differing = (fused != apart).float().mean().item()
        assert differing <= 1e-3, (seed, differing)
