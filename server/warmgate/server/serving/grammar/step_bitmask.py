"""The grammar side of one serving step: a bitmask row per logits row of every constrained
request, in vLLM's GrammarOutput layout (requests in schedule order, each with 1 + k rows)."""

from __future__ import annotations

from warmgate.server.runner.scheduler_output import GrammarOutput
from warmgate.server.serving.grammar.spec import ALL_ALLOWED
from warmgate.server.serving.scheduler import ScheduledWork, StepPlan


def _samples(w: ScheduledWork) -> bool:
    """Whether this step reaches the end of the request's stream (mid-prompt chunks sample
    nothing); read before the scheduler's update advances the request."""
    return w.num_tokens - len(w.draft_token_ids) == w.req.num_uncomputed_tokens


def grammar_output_for(plan: StepPlan) -> GrammarOutput | None:
    """None when no request of the step samples under a grammar (the unconstrained path)."""
    work = [w for w in plan.work if w.req.grammar is not None and _samples(w)]
    if not work:
        return None
    import torch  # only a step with a grammar needs it: serving imports stay free of torch

    first = work[0].req.grammar
    assert first is not None  # filtered above
    rows = sum(1 + len(w.draft_token_ids) for w in work)
    bitmask = torch.full((rows, first.bitmask_width), ALL_ALLOWED, dtype=torch.int32)
    start = 0
    for w in work:
        grammar = w.req.grammar
        assert grammar is not None
        grammar.fill_rows(bitmask, start, w.draft_token_ids)
        start += 1 + len(w.draft_token_ids)
    return GrammarOutput(structured_output_request_ids=[w.req.req_id for w in work],
                         grammar_bitmask=bitmask)
