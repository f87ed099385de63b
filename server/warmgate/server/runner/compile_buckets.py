"""The token counts torch.compile specialises for: a batch's token dimension is padded up to
the smallest bucket that holds it, so a compiled graph exists for every batch after warmup.

Buckets: every uniform-decode size the CUDA graphs capture (capture size x decode_query_len,
so a replayed graph never pads twice), then powers of two above the largest of those, then
max_num_batched_tokens itself. Powers of two keep the padding under 2x for prefill while the
list stays short (9 buckets for the tiny preset's defaults): each bucket costs one compile of
each compiled function during warmup.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence


def _next_pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def compile_buckets(capture_sizes: Sequence[int], decode_query_len: int,
                    max_num_batched_tokens: int) -> tuple[int, ...]:
    decode = {s * decode_query_len for s in capture_sizes
              if 1 <= s * decode_query_len <= max_num_batched_tokens}
    buckets = set(decode)
    b = _next_pow2(max(decode, default=0) + 1)
    while b < max_num_batched_tokens:
        buckets.add(b)
        b *= 2
    buckets.add(max_num_batched_tokens)
    return tuple(sorted(buckets))


def bucket_for(buckets: Sequence[int], num_tokens: int) -> int:
    """The smallest bucket >= num_tokens (buckets sorted ascending)."""
    i = bisect.bisect_left(buckets, num_tokens)
    if i == len(buckets):
        raise ValueError(f"{num_tokens} tokens is more than the largest compile bucket "
                         f"({buckets[-1]}, max_num_batched_tokens)")
    return buckets[i]
