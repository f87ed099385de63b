"""One step's sampling for the runner: every request that reached the end of its stream gets
its tokens (or its drafts verified), with log probabilities where it asked for them."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from warmgate.server.runner.request_state import ScheduledRequest
from warmgate.server.runner.sampling.rows import TokenHistory
from warmgate.server.runner.sampling.sampler import Sampler
from warmgate.server.runner.sampling.seeded import SeededStream
from warmgate.server.runner.sampling.step_logprobs import PromptLogprobs, sampled_logprobs
from warmgate.server.runner.scheduler_output import GREEDY, ModelRunnerOutput


def sample_step(sampler: Sampler, logits: torch.Tensor, scheduled: Sequence[ScheduledRequest],
                prompt_lp: dict[str, PromptLogprobs],
                token_bitmask: torch.Tensor | None = None) -> ModelRunnerOutput:
    """logits: [num_logits_rows, V], the rows of `scheduled` in order; appends the tokens to
    each request's state. token_bitmask: structured output's rows for those logits rows."""
    sampling = [s for s in scheduled if s.num_logits_rows]
    params = [s.state.sampling_params or GREEDY for s in sampling]
    streams = [SeededStream(p.seed, len(s.state.output_token_ids))
               if p.is_seeded and p.seed is not None else None
               for s, p in zip(sampling, params, strict=True)]
    drafts = [list(s.draft_token_ids) for s in sampling]
    # The request's own lists, read only by the processors that need them.
    histories = ([TokenHistory(s.state.prompt_token_ids, s.state.output_token_ids)
                  for s in sampling]
                 if any(p.uses_logits_processors for p in params) else None)
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
