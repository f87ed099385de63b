"""The launch sites that take programmatic dependent launch (kernels/pdl.py), each called once
with small CPU tensors, and the kernels each launches: what tests/test_pdl_launches.py runs
against a recording stand-in for the kernels, and tests/pdl_ptx_probe.py compiles for sm_90.

The calls only have to reach their launches: their results are never read.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from warmgate.server.config.moe_kernel import MoELaunch
from warmgate.server.kernels.activation import silu_and_mul
from warmgate.server.kernels.decode_attention import merge_counts_for, paged_attention_decode
from warmgate.server.kernels.dense_gemv import dense_gemv, silu_mul_gemv
from warmgate.server.kernels.gemv_plan import MAX_ROWS, GemvLaunch
from warmgate.server.kernels.moe_gemv import moe_gemv
from warmgate.server.kernels.moe_route import route_topk
from warmgate.server.kernels.moe_router import counts_for, norm_router_top_k, router_top_k
from warmgate.server.kernels.norm_gemv import norm_gemv
from warmgate.server.kernels.rms_norm import rms_norm
from warmgate.server.kernels.rope_cache import rope_and_cache
from warmgate.server.runner.ops import build_cos_sin_cache

# Every kernel that takes USE_PDL, as (module, attribute): a site must launch each of them.
CONVERTED = (
    ("warmgate.server.kernels.dense_gemv", "_gemv_kernel"),
    ("warmgate.server.kernels.dense_gemv", "_sum_splits_kernel"),
    ("warmgate.server.kernels.rms_norm", "_rms_norm_kernel"),
    ("warmgate.server.kernels.rope_cache", "_rope_cache_kernel"),
    ("warmgate.server.kernels.decode_attention", "_decode_kernel"),
    ("warmgate.server.kernels._decode_merge", "merge_splits_kernel"),
    ("warmgate.server.kernels.activation", "_silu_and_mul_kernel"),
    ("warmgate.server.kernels.moe_gemv", "_gate_up_kernel"),
    ("warmgate.server.kernels.moe_gemv", "_down_kernel"),
    ("warmgate.server.kernels.moe_route", "_route_kernel"),
    ("warmgate.server.kernels.moe_router", "_router_kernel"),
)
# The kernels whose loads of these arguments may come before pdl_wait: weights, which no
# kernel writes once they are loaded.
WEIGHT_ARGS = {"_gemv_kernel": ("w_ptr",), "_rms_norm_kernel": ("weight_ptr",),
               "_router_kernel": ("w_ptr",)}

BF16 = torch.bfloat16
# One row streamed in two K splits (the split-summing kernel runs), and the tl.dot bucket.
ONE_ROW = GemvLaunch(block_m=1, block_n=16, block_k=32, splits=2, k_per_split=32,
                     num_warps=4, num_stages=1)
ROWS = GemvLaunch(block_m=MAX_ROWS, block_n=16, block_k=32, splits=1, k_per_split=64,
                  num_warps=4, num_stages=1)


def _dense_gemv() -> None:
    w, bias = torch.randn(48, 64, dtype=BF16), torch.randn(48, dtype=BF16)
    dense_gemv(torch.randn(1, 64, dtype=BF16), w, bias, launch=ONE_ROW)
    dense_gemv(torch.randn(3, 64, dtype=BF16), w, launch=ROWS)


def _norm_gemv() -> None:
    for x, launch in ((torch.randn(1, 64, dtype=BF16), ONE_ROW),
                      (torch.randn(3, 64, dtype=BF16), ROWS)):
        for residual in (x, None):
            norm_gemv(x, residual, torch.randn(64, dtype=BF16), 1e-6,
                      torch.randn(48, 64, dtype=BF16), launch=launch)


def _silu_mul_gemv() -> None:
    silu_mul_gemv(torch.randn(1, 128, dtype=BF16), torch.randn(48, 64, dtype=BF16),
                  launch=ONE_ROW)


def _rms_norm() -> None:
    x = torch.randn(2, 64, dtype=BF16)
    rms_norm(x, torch.randn(64, dtype=BF16), 1e-6, residual=torch.randn(2, 64, dtype=BF16))


def _silu_and_mul() -> None:
    silu_and_mul(torch.randn(2, 128, dtype=BF16))


def _rope_and_cache() -> None:
    qkv = torch.randn(3, 4, 16, dtype=BF16)  # 2 query heads, 1 KV head, 1 value head
    cache = torch.zeros(4, 4, 1, 16, dtype=BF16)
    norm = torch.ones(16, dtype=BF16)
    rope_and_cache(qkv[:, :2], qkv[:, 2:3], qkv[:, 3:], torch.arange(3),
                   build_cos_sin_cache(8, 16, 10000.0), cache, cache.clone(), torch.arange(3),
                   q_norm_weight=norm, k_norm_weight=norm, eps=1e-6)


def _paged_attention_decode() -> None:
    kv_cache = torch.randn(2, 4, 4, 1, 16, dtype=BF16)
    for counts in (None, merge_counts_for(2, 1, torch.device("cpu"))):  # merge kernel, in-kernel
        paged_attention_decode(torch.randn(2, 2, 16, dtype=BF16), kv_cache,
                               torch.tensor([[0, 1], [2, 3]], dtype=torch.int32),
                               torch.tensor([5, 7], dtype=torch.int32),
                               torch.tensor([0, 1, 2], dtype=torch.int32), scale=0.25,
                               query_len=1, num_splits=2, merge_counts=counts)


def _moe_gemv() -> None:
    ids = torch.tensor([[0, 3], [2, 1]])
    moe_gemv(torch.randn(2, 64, dtype=BF16), torch.randn(4, 64, 64, dtype=BF16),
             torch.randn(4, 64, 32, dtype=BF16), torch.full((4,), 0.5), ids,
             MoELaunch(block_m=1, block_n=16, block_k=32, num_warps=4, num_stages=1))


def _route_topk() -> None:
    route_topk(torch.randn(2, 8, dtype=BF16), 2, True)


def _router_top_k() -> None:
    x, router, counts = (torch.randn(2, 64, dtype=BF16), torch.randn(8, 64, dtype=BF16),
                         counts_for(torch.device("cpu")))
    router_top_k(x, router, counts, 2, True)
    norm_router_top_k(x, x, torch.randn(64, dtype=BF16), 1e-6, router, counts, 2, True)


SITES: dict[str, Callable[[], None]] = {
    "dense_gemv": _dense_gemv, "norm_gemv": _norm_gemv, "silu_mul_gemv": _silu_mul_gemv,
    "rms_norm": _rms_norm,
    "silu_and_mul": _silu_and_mul, "rope_and_cache": _rope_and_cache,
    "paged_attention_decode": _paged_attention_decode, "moe_gemv": _moe_gemv,
    "route_topk": _route_topk, "router_top_k": _router_top_k,
}
