"""One step's sampling for the runner: every request that reached the end of its stream gets
its tokens (or its drafts verified), with log probabilities where it asked for them."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from warmgate.server.runner.request_state import PLACEHOLDER, ScheduledRequest
from warmgate.server.runner.sampling.rows import TokenHistory
from warmgate.server.runner.sampling.sampler import Sampler
from warmgate.server.runner.sampling.seeded import SeededStream
from warmgate.server.runner.sampling.step_logprobs import PromptLogprobs, sampled_logprobs
from warmgate.server.runner.scheduler_output import GREEDY, ModelRunnerOutput, SamplingParams


def _rows(scheduled: Sequence[ScheduledRequest]) -> tuple[
        list[ScheduledRequest], list[SamplingParams], list[SeededStream | None],
        list[TokenHistory] | None]:
    """The sampling requests of a step, and per request its parameters, its seeded stream
    (from the output position it samples) and, where a processor reads it, its history."""
    sampling = [s for s in scheduled if s.num_logits_rows]
    params = [s.state.sampling_params or GREEDY for s in sampling]
    streams = [SeededStream(p.seed, len(s.state.output_token_ids))
               if p.is_seeded and p.seed is not None else None
               for s, p in zip(sampling, params, strict=True)]
    # The request's own lists, read only by the processors that need them.
    histories = ([TokenHistory(s.state.prompt_token_ids, s.state.output_token_ids)
                  for s in sampling]
                 if any(p.uses_logits_processors for p in params) else None)
    if histories is not None:
        for s, p in zip(sampling, params, strict=True):
            # Only the newest two can be pending (one step in flight, one launching).
            if p.has_penalties and PLACEHOLDER in s.state.output_token_ids[-2:]:
                raise RuntimeError(f"request {s.req_id!r}: its penalties read a token still "
                                   "on the device (the scheduler must not overlap this step)")
    return sampling, params, streams, histories


def host_sampling_reason(scheduled: Sequence[ScheduledRequest]) -> str | None:
    """Why this step's tokens must reach the host before its sampling is done: verifying
    drafts reads the accepted count back, and prompt logprobs were read back by the forward
    already. None: the tokens (and the sampled tokens' logprobs) can stay on the device
    (sample_on_device, runner/async_output.py)."""
    if any(s.draft_token_ids for s in scheduled if s.num_logits_rows):
        return "spec_decode"
    for s in scheduled:
        p = s.state.sampling_params
        if p is not None and p.prompt_logprobs is not None:
            return "logprobs"
    return None


def sample_on_device(sampler: Sampler, logits: torch.Tensor,
                     scheduled: Sequence[ScheduledRequest],
                     token_bitmask: torch.Tensor | None = None) -> torch.Tensor:
    """One token per sampling request of a step host_sampling_reason allows, left on the
    device ([R] int64); nothing is appended to the states (runner/async_output.py does)."""
    _, params, streams, histories = _rows(scheduled)
    return sampler.sample(logits, params, streams, histories, token_bitmask)


def sample_step(sampler: Sampler, logits: torch.Tensor, scheduled: Sequence[ScheduledRequest],
                prompt_lp: dict[str, PromptLogprobs],
                token_bitmask: torch.Tensor | None = None) -> ModelRunnerOutput:
    """logits: [num_logits_rows, V], the rows of `scheduled` in order; appends the tokens to
    each request's state. token_bitmask: structured output's rows for those logits rows."""
    sampling, params, streams, histories = _rows(scheduled)
    drafts = [list(s.draft_token_ids) for s in sampling]
    if any(drafts):
        tokens, accepted = sampler.verify(logits, drafts, params, streams,
                                          histories, token_bitmask)
    else:
        flat = sampler.sample(logits, params, streams, histories, token_bitmask).tolist()
        tokens, accepted = [[t] for t in flat], [0] * len(flat)
    logprobs = sampled_logprobs(logits, sampling, tokens, sampler.log_softmax)
    by_req = {s.req_id: (t, a) for s, t, a in zip(sampling, tokens, accepted, strict=True)}
    for s in sampling:
        s.state.output_token_ids.extend(by_req[s.req_id][0])
    req_ids = [s.req_id for s in scheduled]
    lp_by_req = dict(zip((s.req_id for s in sampling), logprobs or [], strict=False))
    return ModelRunnerOutput(
        req_ids=req_ids,
        sampled_token_ids=[by_req[r][0] if r in by_req else [] for r in req_ids],
        num_accepted_draft_tokens=[by_req[r][1] if r in by_req else 0 for r in req_ids],
        logprobs=None if logprobs is None else [
            lp_by_req.get(r, []) for r in req_ids],
        prompt_logprobs=prompt_lp)
