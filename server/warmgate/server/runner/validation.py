"""Cheap checks of a SchedulerOutput before the runner touches any state.

Scheduler outputs will arrive over RPCs, so they are untrusted input: every check is an
explicit ValueError naming the request and the limit (never `assert`, which `python -O`
strips), and all of them run before anything is mutated, so a rejected step leaves the
runner exactly as it was.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass

from warmgate.server.config.runner_config import cdiv
from warmgate.server.config.sampling_limits import (
    GREEDY_BELOW_TEMPERATURE,
    MAX_ABS_LOGIT_BIAS,
    MAX_ABS_PENALTY,
    MAX_REPETITION_PENALTY,
    MIN_REPETITION_PENALTY,
)
from warmgate.server.runner.request_state import RequestState
from warmgate.server.runner.scheduler_output import SamplingParams, SchedulerOutput


@dataclass(frozen=True)
class StepLimits:
    num_blocks: int
    block_size: int
    max_blocks_per_req: int
    max_num_reqs: int
    max_num_tokens: int
    max_model_len: int
    vocab_size: int
    num_kv_cache_groups: int = 1


def _check_blocks(req_id: str, groups: tuple[list[int], ...] | None,
                  limits: StepLimits) -> list[int]:
    if groups is None:
        return []
    if len(groups) != limits.num_kv_cache_groups:
        raise ValueError(f"request {req_id!r}: block ids for {len(groups)} KV cache groups, "
                         f"the runner has {limits.num_kv_cache_groups}")
    blocks = list(groups[0])
    bad = [b for b in blocks if not 0 < b < limits.num_blocks]
    if bad:
        raise ValueError(f"request {req_id!r}: block id {bad[0]} is out of range; valid ids "
                         f"are 1..{limits.num_blocks - 1} (num_blocks={limits.num_blocks}, "
                         f"block 0 is the null block)")
    return blocks


def _check_tokens(req_id: str, what: str, tokens: Iterable[int], vocab_size: int) -> None:
    bad = [t for t in tokens if not 0 <= t < vocab_size]
    if bad:
        raise ValueError(f"request {req_id!r}: {what} token id {bad[0]} is outside the "
                         f"vocabulary [0, {vocab_size})")


# Per request after this step's finished requests are dropped: (blocks, computed, stream length).
_After = dict[str, tuple[int, int, int]]


class _Held:
    """The runner's requests less the step's finished ones, without copying the rest (a step
    looks up its own requests; a copy of the held ones was one dict entry per request)."""

    def __init__(self, requests: Mapping[str, RequestState], finished: AbstractSet[str]) -> None:
        self._requests, self._finished = requests, finished

    def __contains__(self, rid: object) -> bool:
        return rid in self._requests and rid not in self._finished

    def get(self, rid: str) -> RequestState | None:
        return None if rid in self._finished else self._requests.get(rid)


def validate_scheduler_output(so: SchedulerOutput, requests: Mapping[str, RequestState],
                              limits: StepLimits) -> None:
    """Raise ValueError on the first inconsistency; return None when the step can run."""
    _check_step_size(so, limits)
    # The requests the runner holds once this step's finished ones are dropped.
    held = _Held(requests, so.finished_req_ids)
    after: _After = {}
    _check_new_requests(so, held, after, limits)
    _check_cached_requests(so, held, after, limits)
    for rid, n in so.num_scheduled_tokens.items():
        _check_scheduled_request(so, rid, n, after, limits)
    _check_nothing_unscheduled(so, after)


def _check_step_size(so: SchedulerOutput, limits: StepLimits) -> None:
    num_reqs = len(so.num_scheduled_tokens)
    if num_reqs > limits.max_num_reqs:
        raise ValueError(f"{num_reqs} requests scheduled, over max_num_reqs "
                         f"(scheduler.max_num_seqs) = {limits.max_num_reqs}")
    total = sum(so.num_scheduled_tokens.values())
    if total != so.total_num_scheduled_tokens:
        raise ValueError(f"total_num_scheduled_tokens is {so.total_num_scheduled_tokens} but "
                         f"num_scheduled_tokens sums to {total}")
    if total > limits.max_num_tokens:
        raise ValueError(f"{total} tokens scheduled, over scheduler.max_num_batched_tokens "
                         f"= {limits.max_num_tokens}")


def _check_new_requests(so: SchedulerOutput, held: _Held, after: _After,
                        limits: StepLimits) -> None:
    for new in so.scheduled_new_reqs:
        rid = new.req_id
        if rid in held or rid in after:
            raise ValueError(f"new request {rid!r} is already held by the runner; finish it "
                             f"(finished_req_ids) before scheduling it again")
        if not new.prompt_token_ids:
            raise ValueError(f"new request {rid!r}: prompt_token_ids is empty")
        if len(new.prompt_token_ids) > limits.max_model_len:
            raise ValueError(f"new request {rid!r}: prompt of {len(new.prompt_token_ids)} "
                             f"tokens is over max_model_len = {limits.max_model_len}")
        _check_tokens(rid, "prompt", new.prompt_token_ids, limits.vocab_size)
        _check_tokens(rid, "output", new.output_token_ids, limits.vocab_size)
        if new.sampling_params is not None:
            _check_sampling(rid, new.sampling_params, limits.vocab_size)
        if new.num_computed_tokens < 0:
            raise ValueError(f"new request {rid!r}: num_computed_tokens is negative")
        blocks = _check_blocks(rid, new.block_ids, limits)
        after[rid] = (len(blocks), new.num_computed_tokens,
                      len(new.prompt_token_ids) + len(new.output_token_ids))


def _check_sampling(req_id: str, p: SamplingParams, vocab_size: int) -> None:
    """The float options inside the ranges that keep the sampler finite (the API's, in
    config.sampling_limits): out of them a step yields inf or NaN logits, not an error."""
    ranges = {"repetition_penalty": (p.repetition_penalty, MIN_REPETITION_PENALTY,
                                     MAX_REPETITION_PENALTY),
              "presence_penalty": (p.presence_penalty, -MAX_ABS_PENALTY, MAX_ABS_PENALTY),
              "frequency_penalty": (p.frequency_penalty, -MAX_ABS_PENALTY, MAX_ABS_PENALTY),
              "min_p": (p.min_p, 0.0, 1.0), "top_p": (p.top_p, 0.0, 1.0),
              # 0 is greedy; between 0 and the greedy threshold logits / t overflow.
              "temperature": (p.temperature, 0.0 if p.temperature == 0.0
                              else GREEDY_BELOW_TEMPERATURE, math.inf)}
    for name, (value, low, high) in ranges.items():
        if not (low <= value <= high and math.isfinite(value)):  # NaN fails both
            raise ValueError(f"request {req_id!r}: {name} {value} is outside [{low:g}, "
                             f"{high:g}]")
    for token, bias in p.logit_bias:
        if not 0 <= token < vocab_size or not abs(bias) <= MAX_ABS_LOGIT_BIAS:
            raise ValueError(f"request {req_id!r}: logit_bias {token}: {bias} is outside the "
                             f"vocabulary [0, {vocab_size}) or [-{MAX_ABS_LOGIT_BIAS:g}, "
                             f"{MAX_ABS_LOGIT_BIAS:g}]")


def _check_cached_requests(so: SchedulerOutput, held: _Held, after: _After,
                           limits: StepLimits) -> None:
    cached = so.scheduled_cached_reqs
    if not (len(cached.req_ids) == len(cached.new_block_ids) == len(cached.num_computed_tokens)):
        raise ValueError("scheduled_cached_reqs: req_ids, new_block_ids and "
                         "num_computed_tokens must have the same length")
    for rid, new_blocks, computed in zip(cached.req_ids, cached.new_block_ids,
                                         cached.num_computed_tokens, strict=True):
        state = held.get(rid)
        if state is None or rid in after:
            raise ValueError(f"cached request {rid!r} is unknown to the runner (never "
                             f"scheduled as new, already finished, or listed twice)")
        if computed < 0:
            raise ValueError(f"cached request {rid!r}: num_computed_tokens is negative")
        num_new = 0 if new_blocks is None else len(_check_blocks(rid, new_blocks, limits))
        after[rid] = (len(state.block_ids) + num_new, computed, state.num_tokens)


def _check_scheduled_request(so: SchedulerOutput, rid: str, n: int, after: _After,
                             limits: StepLimits) -> None:
    """n scheduled tokens (drafts included) fit the request's blocks, max_model_len and the
    tokens the runner holds for it."""
    if rid not in after:
        raise ValueError(f"request {rid!r} has scheduled tokens but is neither in "
                         f"scheduled_new_reqs nor in scheduled_cached_reqs")
    num_blocks, computed, stream_len = after[rid]
    drafts = so.scheduled_spec_decode_tokens.get(rid, ())
    if n < 1 or n <= len(drafts):
        raise ValueError(f"request {rid!r}: {n} tokens scheduled with {len(drafts)} draft "
                         f"tokens; it needs at least one non-draft token")
    if drafts:
        _check_tokens(rid, "draft", drafts, limits.vocab_size)
    seq_len = computed + n
    if seq_len > limits.max_model_len:
        raise ValueError(f"request {rid!r}: sequence reaches {seq_len} tokens, over "
                         f"max_model_len = {limits.max_model_len}")
    if num_blocks > limits.max_blocks_per_req:
        raise ValueError(f"request {rid!r}: holds {num_blocks} blocks, over the "
                         f"{limits.max_blocks_per_req} that max_model_len allows")
    if num_blocks < cdiv(seq_len, limits.block_size):
        raise ValueError(f"request {rid!r}: {seq_len} tokens need "
                         f"{cdiv(seq_len, limits.block_size)} blocks of "
                         f"{limits.block_size}, it holds {num_blocks}")
    num_inputs = n - len(drafts)
    if num_inputs > 1 and computed + num_inputs > stream_len:
        raise ValueError(f"request {rid!r}: tokens {computed}..{computed + num_inputs - 1} "
                         f"scheduled but the runner holds only {stream_len}")


def _check_nothing_unscheduled(so: SchedulerOutput, after: _After) -> None:
    unscheduled = sorted(set(after) - set(so.num_scheduled_tokens))
    if unscheduled:
        raise ValueError(f"request(s) {unscheduled} listed as scheduled but missing from "
                         f"num_scheduled_tokens")
    extra = set(so.scheduled_spec_decode_tokens) - set(so.num_scheduled_tokens)
    if extra:
        raise ValueError(f"draft tokens for unscheduled request(s) {sorted(extra)}")
