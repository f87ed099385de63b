"""The part of a closed-loop load run in which every stream is busy.

A closed loop keeps `streams` requests in flight: each one that finishes lets the next queued
request go (load_gen's concurrency gate). Its start and its end are not steady: the first
wave's prompts all arrive together and wait for prefill, and once the queue is empty the
streams finish one by one with nobody taking their place. Between the moment the last stream
of the first wave receives its first token and the moment a stream finishes with the queue
empty, all `streams` slots are decoding, prefilling or waiting to, as a server with that many
users always is. Output tokens/s and inter-token latency read over that window are the
steady state "N concurrent streams" means in published serving benchmarks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from warmgate.server.devtools.load_stats import RequestResult, Stats


@dataclass(frozen=True)
class SteadyWindow:
    start_s: float
    end_s: float
    output_tokens: int  # tokens whose message arrived within the window
    itl_s: Stats  # per-token gaps whose both ends fall within the window

    @property
    def seconds(self) -> float:
        return self.end_s - self.start_s

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.seconds


def steady_window(results: Sequence[RequestResult], streams: int) -> SteadyWindow | None:
    """The window of `results` (one closed-loop run at `streams` concurrency) in which every
    stream was busy; None without one: fewer requests than two a stream, or one unfinished."""
    if streams < 1:
        raise ValueError("streams must be >= 1")
    firsts = sorted(r.messages[0][0] for r in results if r.messages)
    finishes = sorted(r.finish_s for r in results if r.finish_s is not None)
    if len(results) < 2 * streams or len(firsts) < streams or len(finishes) < len(results):
        return None
    # The streams-th first token: every slot of the first wave is decoding by then.
    start = firsts[streams - 1]
    # Finishes before this one each let a queued request go; this one lets none.
    end = finishes[len(results) - streams]
    # At least streams + 1 requests finished by `end`, each after its own first token, so
    # `end` can reach `start` only when timestamps coincide.
    if end <= start:
        return None
    tokens = sum(n for r in results for t, n in r.messages if start < t <= end)
    gaps = [x for r in results for x in r.itl_s(start, end)]
    return SteadyWindow(start, end, tokens, Stats.of(gaps))
