"""The decode kernel that rotates q and k and writes the cache itself, compiled for the GPU at
the served models' head shapes, against rope_and_cache then the decode kernel, over many
launches. Every cache slot this step writes starts as NaN, so a program that read one of them
back before its threads had written it (the barrier in kernels/_decode_rope.py) would give NaN
somewhere in the output. Compiled apart, the two kernels may contract the rotation's multiply
and add differently, so neither the cache nor the output is always the same bits: on an H100
up to 2 of 11.6 million cache elements differed, each by one bf16 ulp, and 0.29% of the
output's, at a relative error of 1.5e-4 at most (tests/gpu/decode_rope_bits_probe.py,
bench/results/h100-decode-rope-bits-cases.txt). So each cache element is held to one ulp, and
the output, whose elements sum many products (an element near zero can differ by many of its
own ulps), to a relative error and a share of differing elements; a slot read before it was
written is off by far more.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from triton.runtime.interpreter import InterpretedFunction

from tests.paged_reference import assert_fused_decode_close, make_paged_batch
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
CONTEXTS = [0, 1, 15, 16, 63, 64, 65, 200, 511, 1000, 1500, 2000]
SEEDS = 20


@pytest.mark.parametrize(("num_heads", "num_kv_heads", "head_dim", "q_len", "num_splits",
                          "qk_norm"), CASES)
def test_the_fused_decode_gives_the_two_launches_bits(num_heads: int, num_kv_heads: int,
                                                      head_dim: int, q_len: int,
                                                      num_splits: int, qk_norm: bool) -> None:
    for seed in range(SEEDS):
        batch = make_paged_batch(seed, [q_len] * len(CONTEXTS), CONTEXTS, num_heads,
                                 num_kv_heads, head_dim, 16, torch.bfloat16, "cuda")
        fused, fused_cache, apart, apart_cache = both_paths(batch, q_len, num_splits, qk_norm,
                                                            max_pos=4096)
        assert_fused_decode_close(fused, apart, fused_cache, apart_cache, seed)
