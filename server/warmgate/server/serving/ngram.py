"""Prompt-lookup drafting: propose the tokens that followed the last earlier occurrence of the
sequence's current suffix (an n-gram, longest first), as vLLM's ngram proposer does.

Each request keeps, per n, a map from n-gram to the end position of its latest occurrence,
updated as tokens are appended, so a proposal costs O(max_n) per step rather than a scan of
the whole context (a host-side scan per request per step would cost more than the GPU step).

An n-gram's key is its tokens as little-endian uint32 bytes: a slice of one buffer per token
appended, and for a long run of tokens (a prompt) numpy's sliding windows make every key at
once. Indexing a 1666-token prompt one tuple at a time took 3-11 ms of the event loop on the
CPU it was measured on, inside the request's time to first token; in bulk it takes a tenth.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

TOKEN_BYTES = 4
# Appends longer than this go through numpy (a prompt, a prefill chunk's worth of tokens);
# shorter ones, a step's one to 1 + k tokens, one token at a time.
BULK_MIN_TOKENS = 32


class NgramIndex:
    def __init__(self, min_n: int, max_n: int) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"n-gram sizes need 1 <= min_n <= max_n, got {min_n}..{max_n}")
        self.min_n, self.max_n = min_n, max_n
        self.tokens: list[int] = []
        self._bytes = bytearray()  # self.tokens as little-endian uint32
        # n -> n-gram key -> end index (inclusive) of its latest occurrence.
        self._last_end: dict[int, dict[bytes, int]] = {
            n: {} for n in range(min_n, max_n + 1)}
        # n -> end index of the occurrence before the current suffix, or -1 (no match).
        self._match: dict[int, int] = {}

    def extend(self, new_tokens: Sequence[int]) -> None:
        if len(new_tokens) >= BULK_MIN_TOKENS:
            self._extend_bulk(new_tokens)
            return
        # A step's tokens, for each of up to 128 requests a step: every n-gram ending at the
        # new token is one slice of a bytes object of the last max_n tokens, not two copies
        # out of the whole buffer (bench/results/cpu-host-step-ngram.txt).
        tokens, match, data = self.tokens, self._match, self._bytes
        tail_bytes = self.max_n * TOKEN_BYTES
        for token in new_tokens:
            tokens.append(token)
            data += token.to_bytes(TOKEN_BYTES, "little")
            count = len(tokens)
            tail = bytes(data[-tail_bytes:])
            for n, table in self._last_end.items():
                if count < n:
                    match[n] = -1
                    continue
                gram = tail[-n * TOKEN_BYTES:]
                match[n] = table.get(gram, -1)
                table[gram] = count - 1

    def _extend_bulk(self, new_tokens: Sequence[int]) -> None:
        start = len(self.tokens)
        self.tokens.extend(new_tokens)
        new = np.asarray(new_tokens, dtype="<u4")
        self._bytes += new.tobytes()
        total = len(self.tokens)
        for n, table in self._last_end.items():
            if total < n:
                self._match[n] = -1
                continue
            # The windows that end at a new token: they start at most n - 1 tokens earlier.
            first = max(0, start - n + 1)
            tail = np.frombuffer(self._bytes, dtype="<u4", offset=first * TOKEN_BYTES)
            windows = np.ascontiguousarray(sliding_window_view(tail, n))
            keys: list[bytes] = windows.view(f"V{n * TOKEN_BYTES}").ravel().tolist()
            suffix = keys[-1]
            try:  # the suffix's latest earlier end among the new windows...
                prev = first + n - 1 + len(keys) - 2 - keys[-2::-1].index(suffix)
            except ValueError:  # ...or before them
                prev = table.get(suffix, -1)
            # In order, so each key keeps its latest end.
            table.update(zip(keys, range(first + n - 1, total), strict=True))
            self._match[n] = prev

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
