"""A pooling model's output: the hidden state of each request's last prompt token."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from warmgate.server.runner.input_batch import StepInputs
from warmgate.server.runner.scheduler_output import ModelRunnerOutput


def pool_last_tokens(hidden: torch.Tensor, inputs: StepInputs) -> ModelRunnerOutput:
    """Last-token pooling, L2-normalised, for requests whose prompt ended this step."""
    starts = inputs.meta.query_start_loc_cpu.tolist()
    done = [i for i, s in enumerate(inputs.scheduled) if s.needs_logits]
    rows = torch.tensor([starts[i + 1] - 1 for i in done], dtype=torch.long,
                        device=hidden.device)
    pooled = F.normalize(hidden.index_select(0, rows).float(), dim=-1).cpu()
    outputs: list[object] = [None] * len(inputs.scheduled)
    for j, i in enumerate(done):
        outputs[i] = pooled[j]
    req_ids = inputs.req_ids
    return ModelRunnerOutput(req_ids=req_ids, sampled_token_ids=[[] for _ in req_ids],
                             num_accepted_draft_tokens=[0] * len(req_ids),
                             pooler_output=outputs)
