"""The token counts torch.compile specialises for: a batch's token dimension is padded up to
the smallest bucket that holds it, so a compiled graph exists for every batch after warmup.

Buckets: every uniform-decode size the CUDA graphs capture (capture size x decode_query_len,
so a replayed graph never pads twice), then powers of two above the largest of those, then
max_num_batched_tokens itself. Powers of two keep the padding under 2x for prefill while the
list stays short (9 buckets for the tiny preset's defaults): each bucket costs one compile of
each compiled function during warmup. Without torch.compile the ragged-batch CUDA graphs,
whose only cost per bucket is a capture, take finer buckets where steps are compute-bound
(ragged_buckets).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence


def _next_pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def _powers_of_two_above(n: int, limit: int) -> list[int]:
    """The powers of two greater than n and less than limit, ascending."""
    powers = []
    b = _next_pow2(n + 1)
    while b < limit:
        powers.append(b)
        b *= 2
    return powers


def compile_buckets(capture_sizes: Sequence[int], decode_query_len: int,
                    max_num_batched_tokens: int) -> tuple[int, ...]:
    decode = {s * decode_query_len for s in capture_sizes
              if 1 <= s * decode_query_len <= max_num_batched_tokens}
    above = _powers_of_two_above(max(decode, default=0), max_num_batched_tokens)
    return tuple(sorted({*decode, *above, max_num_batched_tokens}))


def bucket_for(buckets: Sequence[int], num_tokens: int) -> int:
    """The smallest bucket >= num_tokens (buckets sorted ascending)."""
    i = bisect.bisect_left(buckets, num_tokens)
    if i == len(buckets):
        raise ValueError(f"{num_tokens} tokens is more than the largest compile bucket "
                         f"({buckets[-1]}, max_num_batched_tokens)")
    return buckets[i]


# Past this many rows a bfloat16 projection is compute-bound on current GPUs (an H100 does
# about 300 FLOP in the time it reads a byte), so a padding row costs its full share of the
# step; below it a padded row is nearly free beside the weights' read.
FINE_FROM = 256
# Buckets per doubling in the fine range: a batch pads by at most an eighth.
FINE_PER_OCTAVE = 8


def ragged_buckets(capture_sizes: Sequence[int], decode_query_len: int,
                   max_num_batched_tokens: int, max_mixed_tokens: int) -> tuple[int, ...]:
    """The token buckets of the ragged-batch CUDA graphs when torch.compile is off: the
    compile buckets up to FINE_FROM tokens; from there up to max_mixed_tokens (the most a step
    beside decodes can hold: the prompt bound while decoding plus every decode token) eight a
    doubling, m * 2^k / 8 for m = 8..15; powers of two above, for steps of prompts alone; and
    the budget. Powers of two throughout padded a step of 1,024 prompt tokens beside 128
    decodes (1,152 tokens) to 2,048, 1.8x the projections' compute of every such step."""
    small = [b for b in compile_buckets(capture_sizes, decode_query_len, max_num_batched_tokens)
             if b <= FINE_FROM]
    top = min(max_mixed_tokens, max_num_batched_tokens)
    fine = []
    base = FINE_FROM
    while base < top:
        fine += [base * m // FINE_PER_OCTAVE
                 for m in range(FINE_PER_OCTAVE, 2 * FINE_PER_OCTAVE)]
        base *= 2
    # The first bucket that holds every step beside decodes (a small bound: one of the compile
    # buckets); powers of two go on from it.
    covering = min([b for b in (*small, *fine) if b >= top] + [max_num_batched_tokens])
    fine = [b for b in fine if b <= covering]
    above = _powers_of_two_above(covering, max_num_batched_tokens)
    return tuple(sorted({*small, *fine, *above, max_num_batched_tokens}))
