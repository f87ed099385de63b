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


def is_prefilling(num_computed_tokens: int, num_prompt_tokens: int) -> bool:
    """Whether a request is still reading its prompt: its first step whatever the prompt's
    length (a 2-token prompt at one speculative step has a decode's shape), every later chunk
    of it, and the start of a request resumed after preemption (it recomputes from 0)."""
    return num_computed_tokens < num_prompt_tokens


def is_uniform_decode(num_tokens: int, num_reqs: int, max_query_len: int,
                      decode_query_len: int, *, any_prefill: bool) -> bool:
    """Uniform iff no request is prefilling and every request has a decode's query length.

    The shape alone is not enough: with one speculative step a 2-token prefill has a decode's
    query length, and running it as a uniform decode would take the CUDA-graph path.
    """
    return (not any_prefill and num_reqs > 0 and num_tokens == max_query_len * num_reqs
            and max_query_len == decode_query_len)


def classify_batch(query_lens: Sequence[int], decode_query_len: int,
                   is_prefill: Sequence[bool] | None = None) -> BatchKind:
    """Classify a batch from its per-request query lengths.

    `is_prefill` says, per request, whether it is still reading its prompt; when omitted a
    request counts as prefill iff its query is longer than a decode's. A batch with any
    prefilling request is never a uniform decode, as the runner decides (input_batch).
    """
    if not query_lens:
        raise ValueError("query_lens: a batch needs at least one request")
    num_tokens = sum(query_lens)
    flags = list(is_prefill) if is_prefill is not None else [q > decode_query_len
                                                              for q in query_lens]
    if is_uniform_decode(num_tokens, len(query_lens), max(query_lens), decode_query_len,
                         any_prefill=any(flags)):
        return BatchKind.UNIFORM_DECODE
    if all(flags):
        return BatchKind.PREFILL
    return BatchKind.MIXED
