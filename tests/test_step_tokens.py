"""The scheduler keeps a step's sampled tokens up to the first stop condition: the cut-point
form a request without a grammar uses gives what checking token by token gives."""

from __future__ import annotations

import random

from warmgate.server.runner.scheduler_output import SamplingParams
from warmgate.server.serving.request import FinishReason, ServingRequest


def one_by_one(req: ServingRequest, tokens: list[int], max_model_len: int
               ) -> tuple[list[int], FinishReason | None]:
    """The rule stated token by token: append, then stop token, max_tokens, max_model_len."""
    outputs = list(req.output_token_ids)
    kept: list[int] = []
    for token in tokens:
        kept.append(token)
        outputs.append(token)
        if token in req.params.stop_token_ids:
            return kept, FinishReason.STOP
        if req.params.max_tokens - len(outputs) <= 0:
            return kept, FinishReason.LENGTH
        if len(req.prompt_token_ids) + len(outputs) >= max_model_len:
            return kept, FinishReason.MAX_MODEL_LEN
    return kept, None


def test_cut_points_match_the_token_by_token_checks_with_their_precedence() -> None:
    rng = random.Random(0)
    seen: set[FinishReason | None] = set()
    for _ in range(4000):
        prompt = [1] * rng.randint(1, 6)
        outputs = [2] * rng.randint(0, 6)
        stop = tuple(rng.sample(range(8), rng.randint(0, 2)))
        req = ServingRequest("r", prompt, SamplingParams(
            temperature=0.0, max_tokens=len(outputs) + rng.randint(0, 4),
            stop_token_ids=stop), 0.0, output_token_ids=outputs)
        tokens = [rng.randrange(8) for _ in range(rng.randint(1, 4))]
        max_model_len = len(prompt) + len(outputs) + rng.randint(0, 4)
        got = req.tokens_to_keep(tokens, max_model_len)
        assert got == one_by_one(req, tokens, max_model_len), (prompt, outputs, stop, tokens)
        seen.add(got[1])
    assert seen == {None, *FinishReason}  # every outcome and tie was drawn
