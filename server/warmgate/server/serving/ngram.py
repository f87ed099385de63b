"""Prompt-lookup drafting: propose the tokens that followed the last earlier occurrence of the
sequence's current suffix (an n-gram, longest first), as vLLM's ngram proposer does.

Each request keeps, per n, a map from n-gram to the end position of its latest occurrence,
updated as tokens are appended, so a proposal costs O(max_n) per step rather than a scan of
the whole context (a host-side scan per request per step would cost more than the GPU step).
"""

from __future__ import annotations

from collections.abc import Sequence


class NgramIndex:
    def __init__(self, min_n: int, max_n: int) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"n-gram sizes need 1 <= min_n <= max_n, got {min_n}..{max_n}")
        self.min_n, self.max_n = min_n, max_n
        self.tokens: list[int] = []
        # n -> n-gram -> end index (inclusive) of its latest occurrence.
        self._last_end: dict[int, dict[tuple[int, ...], int]] = {
            n: {} for n in range(min_n, max_n + 1)}
        # n -> end index of the occurrence before the current suffix, or -1 (no match).
        self._match: dict[int, int] = {}

    def extend(self, new_tokens: Sequence[int]) -> None:
        for token in new_tokens:
            self.tokens.append(token)
            end = len(self.tokens) - 1
            for n, table in self._last_end.items():
                if end + 1 < n:
                    self._match[n] = -1
                    continue
                gram = tuple(self.tokens[end + 1 - n:])
                self._match[n] = table.get(gram, -1)
                table[gram] = end

    def propose(self, k: int) -> list[int]:
        """k tokens that followed the longest matching suffix; [] when none matches.

        When the match is closer than k tokens to the end, the stretch between the two
        occurrences is repeated: a sequence that has started to loop is assumed to go on.
        """
        if k <= 0:
            return []
        end = len(self.tokens) - 1
        for n in range(self.max_n, self.min_n - 1, -1):
            prev_end = self._match.get(n, -1)
            if prev_end >= 0:
                period = end - prev_end
                return [self.tokens[prev_end + 1 + i % period] for i in range(k)]
        return []
