"""Batch classification: the one predicate that decides which execution path a batch takes."""

from __future__ import annotations

import enum
from collections.abc import Sequence


class BatchKind(enum.Enum):
    # Every request is decoding with the same query length: the CUDA-graph path.
    UNIFORM_DECODE = "uniform_decode"
    # Every request is (still) reading its prompt.
    PREFILL = "prefill"
    # Anything else: runs eagerly.
    MIXED = "mixed"


def is_uniform_decode(num_tokens: int, num_reqs: int, max_query_len: int,
                      decode_query_len: int) -> bool:
    """vLLM's rule: uniform iff every request has max_query_len tokens and that is a decode's."""
    return (num_reqs > 0 and num_tokens == max_query_len * num_reqs
            and max_query_len == decode_query_len)


def classify_batch(query_lens: Sequence[int], decode_query_len: int,
                   is_prefill: Sequence[bool] | None = None) -> BatchKind:
    """Classify a batch from its per-request query lengths.

    `is_prefill` says, per request, whether it is still reading its prompt; when omitted a
    request counts as prefill iff its query is longer than a decode's. A uniform decode is
    decided by shapes alone, as the runner does, which is why a warmup prefill must use more
    than decode_query_len tokens per request.
    """
    if not query_lens:
        raise ValueError("query_lens: a batch needs at least one request")
    num_tokens = sum(query_lens)
    if is_uniform_decode(num_tokens, len(query_lens), max(query_lens), decode_query_len):
        return BatchKind.UNIFORM_DECODE
    flags = list(is_prefill) if is_prefill is not None else [q > decode_query_len
                                                              for q in query_lens]
    if all(flags):
        return BatchKind.PREFILL
    return BatchKind.MIXED
