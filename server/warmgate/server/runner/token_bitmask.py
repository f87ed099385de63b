"""The step's structured-output bitmask on the device, in logits-row order.

GrammarOutput holds rows only for constrained requests; the sampler needs one row per logits
row. The rows are laid out in a persistent host buffer (pinned on CUDA), every unconstrained
row all-allowed, and copied to the device in one copy per step. The buffers are allocated on
the first constrained step (the warmup's structured phase, before ready): a model nobody sends
grammars to never pays for them.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from warmgate.server.runner.request_state import ScheduledRequest
from warmgate.server.runner.scheduler_output import GrammarOutput

ALL_ALLOWED = -1


class TokenBitmaskBuffer:
    def __init__(self, max_rows: int, vocab_size: int, device: torch.device) -> None:
        self.max_rows = max_rows
        self.width = (vocab_size + 31) // 32
        self.device = device
        self._cpu: torch.Tensor | None = None
        self._gpu: torch.Tensor | None = None

    def _buffers(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self._cpu is None or self._gpu is None:
            shape = (self.max_rows, self.width)
            self._cpu = torch.empty(shape, dtype=torch.int32,
                                    pin_memory=self.device.type == "cuda")
            self._gpu = (self._cpu if self.device.type == "cpu"
                         else torch.empty(shape, dtype=torch.int32, device=self.device))
        return self._cpu, self._gpu

    def layout(self, sampling: Sequence[ScheduledRequest], grammar: GrammarOutput | None
               ) -> torch.Tensor | None:
        """[num_logits_rows, width] int32 on the device, or None when no row is constrained
        (the sampler then takes the unconstrained path)."""
        if grammar is None or not grammar.structured_output_request_ids:
            return None
        src = grammar.grammar_bitmask
        if src is None or src.dtype != torch.int32 or src.dim() != 2 or \
                src.shape[1] != self.width:
            raise ValueError(f"grammar_bitmask must be int32 [rows, {self.width}], got "
                             f"{None if src is None else (src.dtype, tuple(src.shape))}")
        offsets: dict[str, tuple[int, int]] = {}
        num_rows = 0
        for s in sampling:
            offsets[s.req_id] = (num_rows, s.num_logits_rows)
            num_rows += s.num_logits_rows
        if num_rows > self.max_rows:
            raise ValueError(f"{num_rows} logits rows, the bitmask buffer holds {self.max_rows}")
        cpu, gpu = self._buffers()
        host = cpu[:num_rows]
        host.fill_(ALL_ALLOWED)
        read = 0
        for req_id in grammar.structured_output_request_ids:
            if req_id not in offsets:
                raise ValueError(f"grammar output names request {req_id!r}, which samples "
                                 "nothing this step")
            start, n = offsets[req_id]
            host[start:start + n] = src[read:read + n]
            read += n
        if read != src.shape[0]:
            raise ValueError(f"grammar_bitmask has {src.shape[0]} rows, the constrained "
                             f"requests sample {read}")
        if gpu is cpu:
            return host
        # The step's sampled tokens go to the host (a sync) before the next step refills
        # the pinned rows, so this non-blocking copy has always finished by then.
        return gpu[:num_rows].copy_(host, non_blocking=True)
