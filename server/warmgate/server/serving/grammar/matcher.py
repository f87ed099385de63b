"""One request's grammar state: an xgrammar GrammarMatcher that fills the request's bitmask
rows for a step and accepts the tokens the step produced."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import xgrammar as xgr

from warmgate.server.serving.grammar.spec import (
    ALL_ALLOWED,
    GrammarDeadEnd,
    GrammarSpec,
    GrammarViolation,
)


class RequestGrammar:
    def __init__(self, matcher: xgr.GrammarMatcher, vocab_size: int,
                 field: str = "sampling.grammar", spec: GrammarSpec | None = None) -> None:
        self.matcher = matcher
        # What the grammar was compiled from: an engine process rebuilds its matcher from it.
        self.spec = spec
        self.vocab_size = vocab_size
        self.field = field  # the request field the grammar came in, for its errors
        self.num_accepted = 0

    @property
    def bitmask_width(self) -> int:
        return (self.vocab_size + 31) // 32

    @property
    def is_terminated(self) -> bool:
        return bool(self.matcher.is_terminated())

    def is_dead_end(self) -> bool:
        """Whether the grammar allows no token now (and has not ended): no string it admits
        starts with the output so far."""
        if self.matcher.is_terminated():
            return False
        row = torch.empty((1, self.bitmask_width), dtype=torch.int32)
        self.matcher.fill_next_token_bitmask(row, 0)
        return not bool(row.any())

    def fill_rows(self, bitmask: torch.Tensor, start: int, drafts: Sequence[int]) -> None:
        """Fill rows start .. start + len(drafts) of `bitmask` (int32, CPU): row j allows what
        the grammar allows after the drafts before it.

        Speculative drafts are checked by per-position bitmasks with rollback, rather than by
        truncating them before verification: truncation would give requests different query
        lengths, so the step would stop being a uniform decode and miss its CUDA graph. The
        matcher accepts the drafts one by one to fill each next row and is rolled back after,
        so its state is again the request's accepted output. At the first draft the grammar
        rejects, the row before it (the position that draft sits at) already forbids it, so
        the target cannot draw it and verification stops there; the rows after it are never
        read and stay all-allowed. The same holds after a draft that ends the grammar.

        A row the grammar leaves empty (a dead end: no string it admits continues the output)
        is left all-allowed rather than handed to the sampler with every logit at -inf; the
        token drawn there is then refused by accept(), which names the dead end.
        """
        accepted = 0
        filled = 0
        try:
            for j in range(len(drafts) + 1):
                if self.matcher.is_terminated():
                    break
                self.matcher.fill_next_token_bitmask(bitmask, start + j)
                if not bool(bitmask[start + j].any()):
                    break
                filled += 1
                if j == len(drafts) or not self.matcher.accept_token(int(drafts[j])):
                    break
                accepted += 1
        finally:
            if accepted:
                self.matcher.rollback(accepted)
        bitmask[start + filled:start + len(drafts) + 1] = ALL_ALLOWED

    def accept(self, token: int) -> bool:
        """Advance by one produced token; True when the grammar has terminated (it accepted
        the end-of-sequence token after a complete match). GrammarDeadEnd when the grammar
        allowed no token here."""
        if not self.matcher.accept_token(int(token)):
            if self.is_dead_end():
                raise GrammarDeadEnd(self.field, self.num_accepted)
            raise GrammarViolation(f"token {token} is not allowed by the request's grammar "
                                   "although its bitmask was applied")
        self.num_accepted += 1
        return self.is_terminated
