"""Log probabilities of chosen tokens and the most likely ones, from the raw logits.

They are the model's own (log_softmax of its logits, before processors and warpers), as
vLLM's default logprobs mode; a row's rank is 1 + the number of tokens strictly more likely.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from warmgate.server.config.sampling_limits import MAX_LOGPROBS
from warmgate.server.runner.host_copy import to_device
from warmgate.server.runner.scheduler_output import TokenLogprobs

__all__ = ["MAX_LOGPROBS", "gather_logprobs"]



def gather_logprobs(logits: torch.Tensor, rows: Sequence[int], token_ids: Sequence[int],
                    num_top: Sequence[int],
                    log_softmax: Callable[[torch.Tensor], torch.Tensor] | None = None,
                    ) -> list[TokenLogprobs]:
    """For each i: token_ids[i]'s logprob and rank at logits row rows[i], with that row's
    num_top[i] most likely tokens. One host->device copy and one sync. log_softmax: [n, V]
    -> float32 [n, V] (the runner's ops'; None: torch's)."""
    n = len(rows)
    if n == 0:
        return []
    dev = logits.device
    idx = to_device([*rows, *token_ids], torch.long, dev)
    picked = logits.index_select(0, idx[:n])
    lp = (torch.log_softmax(picked.float(), dim=-1) if log_softmax is None
          else log_softmax(picked))  # [n, V] float32
    chosen = lp.gather(1, idx[n:, None])  # [n, 1]
    rank = (lp > chosen).sum(dim=-1, keepdim=True) + 1
    parts = [chosen.double(), rank.double()]
    k = max(num_top)
    if k:
        top_v, top_i = lp.topk(min(k, lp.shape[-1]), dim=-1)
        parts += [top_v.double(), top_i.double()]  # ids < 2**53 are exact in float64
    host = torch.cat(parts, dim=1).tolist()  # the one sync
    out = []
    for i, row in enumerate(host):
        m = num_top[i]
        top = tuple(zip((int(t) for t in row[2 + k:2 + k + m]), row[2:2 + m], strict=True))
        out.append(TokenLogprobs(int(token_ids[i]), row[0], int(row[1]), top))
    return out
