"""Log probabilities (the runner's TokenLogprobs) as GenerateResponse messages."""

from __future__ import annotations

from collections.abc import Sequence

from warmgate.server.runner.scheduler_output import TokenLogprobs
from warmgate.v1 import generate_pb2 as gen_pb


def token_logprobs_to_proto(entries: Sequence[TokenLogprobs]) -> list[gen_pb.TokenLogprobs]:
    return [gen_pb.TokenLogprobs(
        token=gen_pb.TokenLogprob(token_id=e.token_id, logprob=e.logprob), rank=e.rank,
        top=[gen_pb.TokenLogprob(token_id=t, logprob=lp) for t, lp in e.top])
        for e in entries]
