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
    idx = to_device([*rows, *token_ids], torch.long, logits.device)
    table = logprob_table(logits, idx[:n], idx[n:], max(num_top), log_softmax)
    return read_logprob_table(table.tolist(), token_ids, num_top)  # the one sync


def logprob_table(logits: torch.Tensor, rows: torch.Tensor, token_ids: torch.Tensor,
                  k: int, log_softmax: Callable[[torch.Tensor], torch.Tensor] | None = None,
                  ) -> torch.Tensor:
    """On the device: per row rows[i] of logits, token_ids[i]'s logprob and rank, then the k
    most likely logprobs and ids ([n, 2 + 2k] float64; ids < 2**53 are exact). log_softmax:
    [n, V] -> float32 [n, V] (the runner's ops'; None: torch's)."""
    picked = logits.index_select(0, rows)
    lp = (torch.log_softmax(picked.float(), dim=-1) if log_softmax is None
          else log_softmax(picked))  # [n, V] float32
    chosen = lp.gather(1, token_ids[:, None])  # [n, 1]
    rank = (lp > chosen).sum(dim=-1, keepdim=True) + 1
    parts = [chosen.double(), rank.double()]
    if k:
        top_v, top_i = lp.topk(min(k, lp.shape[-1]), dim=-1)
        parts += [top_v.double(), top_i.double()]
    return torch.cat(parts, dim=1)


def read_logprob_table(host: list[list[float]], token_ids: Sequence[int],
                       num_top: Sequence[int]) -> list[TokenLogprobs]:
    """logprob_table's rows, on the host, as TokenLogprobs (row i keeps num_top[i] tops)."""
    k = max(num_top, default=0)
    out = []
    for i, row in enumerate(host):
        m = num_top[i]
        top = tuple(zip((int(t) for t in row[2 + k:2 + k + m]), row[2:2 + m], strict=True))
        out.append(TokenLogprobs(int(token_ids[i]), row[0], int(row[1]), top))
    return out
