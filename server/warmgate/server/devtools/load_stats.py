"""What a Generate load run measured: per-request client times, percentiles and the summary
table the load benches print. No gRPC and no torch here."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

from warmgate.server.core.stats import percentile

# -- what one request measured --------------------------------------------------------------

@dataclass
class RequestResult:
    """Client-side times (time.perf_counter seconds) of one stream, and its final counters."""

    index: int
    sent_s: float
    # (arrival time, tokens in the message) of every message that carried tokens.
    messages: list[tuple[float, int]] = field(default_factory=list)
    finish_s: float | None = None
    # The gRPC status code name on failure ("UNAVAILABLE", ...); None when it finished.
    error: str | None = None
    finish_reason: str = ""
    num_preemptions: int = 0
    num_draft_tokens: int = 0
    num_accepted_draft_tokens: int = 0

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def output_tokens(self) -> int:
        return sum(n for _, n in self.messages)

    @property
    def ttft_s(self) -> float | None:
        return self.messages[0][0] - self.sent_s if self.messages else None

    @property
    def e2e_s(self) -> float | None:
        return None if self.finish_s is None else self.finish_s - self.sent_s

    def itl_s(self, start: float = -math.inf, end: float = math.inf) -> list[float]:
        """Per-token inter-token latencies: the gap before each later message divided by its
        tokens, once per token. Weighting by tokens makes the mean the stream's decode time per
        token, and a step that accepted drafts counts as the faster tokens it produced. With
        start and end, only the gaps whose both ends fall within them."""
        out: list[float] = []
        for (prev, _), (now, n) in pairwise(self.messages):
            if start <= prev and now <= end:
                out += [(now - prev) / n] * n
        return out


# -- statistics -----------------------------------------------------------------------------

@dataclass(frozen=True)
class Stats:
    count: int
    mean: float
    p50: float
    p90: float
    p99: float
    max: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Stats:
        if not values:
            return cls(0, math.nan, math.nan, math.nan, math.nan, math.nan)
        return cls(len(values), math.fsum(values) / len(values), percentile(values, 50),
                   percentile(values, 90), percentile(values, 99), max(values))


@dataclass(frozen=True)
class Summary:
    num_requests: int
    num_ok: int
    errors: dict[str, int]
    ttft_s: Stats
    itl_s: Stats
    e2e_s: Stats
    output_tokens: int
    # First send to last finish (errors included: a failed request still held the server).
    wall_s: float
    num_preemptions: int
    num_draft_tokens: int
    num_accepted_draft_tokens: int

    @property
    def output_tokens_per_s(self) -> float:
        return self.output_tokens / self.wall_s if self.wall_s > 0 else math.nan

    @property
    def requests_per_s(self) -> float:
        return self.num_ok / self.wall_s if self.wall_s > 0 else math.nan

    @property
    def draft_acceptance(self) -> float:
        """Accepted / proposed drafts; NaN without speculation (no drafts is not 0 %)."""
        if not self.num_draft_tokens:
            return math.nan
        return self.num_accepted_draft_tokens / self.num_draft_tokens

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: NaN becomes None (JSON has no NaN)."""

        def clean(x: float) -> float | None:
            return None if math.isnan(x) else round(x, 6)

        def stats(s: Stats) -> dict[str, Any]:
            return {"count": s.count, "mean": clean(s.mean), "p50": clean(s.p50),
                    "p90": clean(s.p90), "p99": clean(s.p99), "max": clean(s.max)}

        return {
            "num_requests": self.num_requests,
            "num_ok": self.num_ok,
            "errors": dict(sorted(self.errors.items())),
            "ttft_s": stats(self.ttft_s),
            "itl_s": stats(self.itl_s),
            "e2e_s": stats(self.e2e_s),
            "output_tokens": self.output_tokens,
            "wall_s": clean(self.wall_s),
            "output_tokens_per_s": clean(self.output_tokens_per_s),
            "requests_per_s": clean(self.requests_per_s),
            "num_preemptions": self.num_preemptions,
            "num_draft_tokens": self.num_draft_tokens,
            "num_accepted_draft_tokens": self.num_accepted_draft_tokens,
            "draft_acceptance": clean(self.draft_acceptance),
        }


def summarize(results: Sequence[RequestResult]) -> Summary:
    ok = [r for r in results if r.ok]
    ends = [r.finish_s for r in results if r.finish_s is not None]
    wall = max(ends) - min(r.sent_s for r in results) if ends else 0.0
    return Summary(
        num_requests=len(results),
        num_ok=len(ok),
        errors=dict(Counter(r.error for r in results if r.error is not None)),
        ttft_s=Stats.of([t for r in ok if (t := r.ttft_s) is not None]),
        itl_s=Stats.of([x for r in ok for x in r.itl_s()]),
        e2e_s=Stats.of([t for r in ok if (t := r.e2e_s) is not None]),
        # Tokens of failed streams count too: the server did produce them within the wall.
        output_tokens=sum(r.output_tokens for r in results),
        wall_s=wall,
        num_preemptions=sum(r.num_preemptions for r in ok),
        num_draft_tokens=sum(r.num_draft_tokens for r in ok),
        num_accepted_draft_tokens=sum(r.num_accepted_draft_tokens for r in ok),
    )


def format_table(summary: Summary) -> str:
    """The latency table (milliseconds) and the totals, as the bench prints them."""
    lines = [f"{'metric':<8} {'count':>7} {'mean':>9} {'p50':>9} {'p90':>9} {'p99':>9} "
             f"{'max':>9}   (ms)"]
    for name, s in (("ttft", summary.ttft_s), ("itl", summary.itl_s), ("e2e", summary.e2e_s)):
        cells = " ".join(f"{v * 1e3:>9.2f}" for v in (s.mean, s.p50, s.p90, s.p99, s.max))
        lines.append(f"{name:<8} {s.count:>7} {cells}")
    errors = ", ".join(f"{k} {v}" for k, v in sorted(summary.errors.items())) or "none"
    acceptance = summary.draft_acceptance
    lines += [
        f"requests: {summary.num_ok}/{summary.num_requests} ok; errors: {errors}",
        f"throughput: {summary.output_tokens_per_s:.1f} output tok/s, "
        f"{summary.requests_per_s:.2f} req/s ({summary.output_tokens} tokens in "
        f"{summary.wall_s:.3f} s)",
        f"preemptions: {summary.num_preemptions}; drafts accepted: "
        f"{summary.num_accepted_draft_tokens}/{summary.num_draft_tokens}"
        + ("" if math.isnan(acceptance) else f" ({acceptance:.1%})"),
    ]
    return "\n".join(lines)
