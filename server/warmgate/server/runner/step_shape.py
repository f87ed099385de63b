"""What a step's inputs are padded to before they are sent: the CUDA graph it replays, or its
eager forward's token count."""

from __future__ import annotations

from dataclasses import dataclass

# An eager forward: the step's requests, its tokens rounded up to eager_tokens (or exact).
EAGER = "eager"
# A uniform-decode graph of num_reqs requests of decode_query_len tokens each: padded
# requests decode on the null block (seq_len decode_query_len, a zero block table row).
UNIFORM = "uniform"
# A ragged batch's token-bucket graph: padded requests have query length 0 and seq_len 0,
# padded tokens belong to no request.
RAGGED = "ragged"


@dataclass(frozen=True)
class StepShape:
    kind: str
    num_tokens: int
    num_reqs: int

    @property
    def is_graph(self) -> bool:
        return self.kind != EAGER
