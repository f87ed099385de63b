"""Where each request's draft and bonus rows sit in a verify step's logits, and the leading
accepted drafts read back with the step's one device->host sync."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from warmgate.server.runner.host_copy import to_device


@dataclass(frozen=True)
class DraftLayout:
    """Request i owns logits rows starts[i] .. starts[i] + k_i: k_i draft rows, then its bonus
    row."""

    draft_token_ids: Sequence[Sequence[int]]
    starts: list[int]
    rows: torch.Tensor  # [num_drafts] the logits row of every draft
    drafts: torch.Tensor  # [num_drafts] the draft tokens
    req: torch.Tensor  # [num_drafts] the request of every draft
    pos: torch.Tensor  # [num_drafts] its position among the request's drafts
    req_starts: torch.Tensor  # [R] starts[:-1] on the device

    @classmethod
    def of(cls, draft_token_ids: Sequence[Sequence[int]], num_rows: int,
           device: torch.device) -> DraftLayout:
        ks = [len(d) for d in draft_token_ids]
        starts = [0]
        for k in ks:
            starts.append(starts[-1] + k + 1)
        if starts[-1] != num_rows:
            raise ValueError(f"verify: {num_rows} logits rows for {sum(ks)} drafts "
                             f"over {len(ks)} requests (expected {starts[-1]})")
        rows = [starts[i] + j for i, k in enumerate(ks) for j in range(k)]
        req = [i for i, k in enumerate(ks) for _ in range(k)]
        pos = [j for k in ks for j in range(k)]
        flat = [t for d in draft_token_ids for t in d]
        # Every index list in one host->device copy, split on the device.
        nd, nr = len(rows), len(ks)
        packed = to_device(rows + flat + req + pos + starts[:-1], torch.long, device)
        r, d, q, p, s = packed.split([nd, nd, nd, nd, nr])
        return cls(draft_token_ids, starts, r, d, q, p, s)

    def accept(self, final: torch.Tensor) -> tuple[list[list[int]], list[int]]:
        """final [M]: every row's own token. Drafts are accepted while they equal their row's
        token; then the token of the first rejected row (or the bonus row) follows."""
        ks = [len(d) for d in self.draft_token_ids]
        accepted = torch.zeros(len(ks), max(ks, default=0), dtype=torch.int32,
                               device=final.device)  # [R, K]
        if self.rows.numel():
            accepted[self.req, self.pos] = (final[self.rows] == self.drafts).int()
        num_accepted = accepted.cumprod(dim=1).sum(dim=1)  # leading accepts, [R]
        tokens = final[self.req_starts + num_accepted]  # [R]
        host = torch.stack([num_accepted.long(), tokens]).tolist()  # the step's one sync
        out = [[*d[:a], t] for d, a, t in zip(self.draft_token_ids, host[0], host[1],
                                                    strict=True)]
        return out, host[0]
