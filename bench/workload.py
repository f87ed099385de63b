"""The pure parts of the Generate load benches: length distributions, the seeded workload,
per-request results and their summary. No gRPC and no torch here, so the unit tests and any
offline analysis import it cheaply.

Distributions are text, so a bench command line says what it replays:
`fixed:128`, `uniform:16:256` (integers, both ends included), `normal:128:32` (rounded to an
integer, clamped to >= 1).
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

from warmgate.server.core.stats import percentile

DISTRIBUTION_KINDS = ("fixed", "uniform", "normal")
# Motif lengths of --repetitive prompts: short enough that a prompt of a few dozen tokens
# repeats it several times, so an n-gram (prompt lookup) drafter always finds a match.
MOTIF_LEN_RANGE = (2, 8)


# -- length distributions -------------------------------------------------------------------

@dataclass(frozen=True)
class Distribution:
    """A distribution of positive integer lengths; `text` is how it was written."""

    kind: str
    params: tuple[float, ...]
    text: str

    def sample(self, rng: random.Random) -> int:
        if self.kind == "fixed":
            value = int(self.params[0])
        elif self.kind == "uniform":
            value = rng.randint(int(self.params[0]), int(self.params[1]))
        else:
            # Clamped rather than redrawn, so every request takes exactly one draw and the
            # rest of the workload does not shift when a draw lands below 1.
            value = round(rng.gauss(self.params[0], self.params[1]))
        return max(1, value)

    @property
    def mean(self) -> float:
        """The mean before clamping (what the text says, for the report header)."""
        if self.kind == "uniform":
            return (self.params[0] + self.params[1]) / 2
        return self.params[0]

    def __str__(self) -> str:
        return self.text


def parse_distribution(text: str) -> Distribution:
    """`fixed:N`, `uniform:LO:HI` or `normal:MEAN:STD`; ValueError naming what is wrong."""
    spec = text.strip()
    kind, _, rest = spec.partition(":")
    kind = kind.lower()
    expected = {"fixed": "fixed:N", "uniform": "uniform:LO:HI", "normal": "normal:MEAN:STD"}
    if kind not in expected:
        raise ValueError(f"{text!r}: unknown distribution {kind!r}; expected one of "
                         + ", ".join(expected.values()))
    parts = rest.split(":") if rest else []
    want = 1 if kind == "fixed" else 2
    if len(parts) != want:
        raise ValueError(f"{text!r}: {kind} takes {want} value{'s' if want > 1 else ''} "
                         f"({expected[kind]}), got {len(parts)}")
    if kind in ("fixed", "uniform"):
        try:
            ints = tuple(int(p) for p in parts)
        except ValueError:
            raise ValueError(f"{text!r}: {expected[kind]} takes integers") from None
        if any(v < 1 for v in ints):
            raise ValueError(f"{text!r}: lengths must be >= 1")
        if kind == "uniform" and ints[0] > ints[1]:
            raise ValueError(f"{text!r}: LO ({ints[0]}) is above HI ({ints[1]})")
        return Distribution(kind, tuple(float(v) for v in ints), spec)
    try:
        mean, std = (float(p) for p in parts)
    except ValueError:
        raise ValueError(f"{text!r}: normal:MEAN:STD takes numbers") from None
    if not (math.isfinite(mean) and math.isfinite(std)):
        raise ValueError(f"{text!r}: MEAN and STD must be finite")
    if std < 0:
        raise ValueError(f"{text!r}: STD must be >= 0")
    if mean < 1:
        raise ValueError(f"{text!r}: MEAN must be >= 1")
    return Distribution(kind, (mean, std), spec)


def parse_rate(text: str) -> float:
    """Requests per second: a positive number, or `inf` (every request at time 0)."""
    try:
        rate = float(text)
    except ValueError:
        raise ValueError(f"{text!r}: expected a number of requests/s or inf") from None
    if math.isnan(rate) or rate <= 0:
        raise ValueError(f"{text!r}: the rate must be > 0 (inf sends all at once)")
    return rate


# -- the workload ---------------------------------------------------------------------------

@dataclass(frozen=True)
class RequestSpec:
    index: int
    # Seconds after the start at which the request arrives (Poisson process; 0 with rate inf).
    arrival_s: float
    prompt_token_ids: tuple[int, ...]
    max_tokens: int
    # The request's sampling seed, so a stochastic replay samples the same tokens.
    seed: int


def poisson_arrivals(n: int, rate: float, rng: random.Random) -> list[float]:
    """Arrival offsets of n requests at `rate` per second; the first arrives at 0, so a run's
    wall time is not padded by an idle gap before anything is sent."""
    if math.isinf(rate):
        return [0.0] * n
    times, t = [], 0.0
    for i in range(n):
        if i:
            t += rng.expovariate(rate)
        times.append(t)
    return times


def make_prompt(length: int, vocab: int, rng: random.Random, repetitive: bool) -> list[int]:
    if not repetitive:
        return [rng.randrange(vocab) for _ in range(length)]
    motif_len = min(length, rng.randint(*MOTIF_LEN_RANGE))
    motif = [rng.randrange(vocab) for _ in range(motif_len)]
    return [motif[i % motif_len] for i in range(length)]


def build_workload(num_requests: int, *, rate: float, prompt_len: Distribution,
                   output_len: Distribution, vocab: int, seed: int, repetitive: bool = False,
                   max_model_len: int | None = None) -> list[RequestSpec]:
    """The requests of one run, the same for the same arguments.

    Each request draws from its own RNG, seeded by (seed, index), and arrivals from another:
    request i is the same whatever the rate or the number of requests, so runs that differ in
    one knob replay the same prompts. With `max_model_len`, a prompt keeps at most
    max_model_len - 1 tokens and its output is cut to fit (the server would refuse it).
    """
    if num_requests < 0:
        raise ValueError("num_requests must be >= 0")
    if vocab < 1:
        raise ValueError("vocab must be >= 1")
    if max_model_len is not None and max_model_len < 2:
        raise ValueError("max_model_len must be >= 2")
    # String seeds hash with sha512 in Random's version-2 seeding: stable across processes
    # and independent of PYTHONHASHSEED.
    arrivals = poisson_arrivals(num_requests, rate, random.Random(f"{seed}/arrivals"))
    specs = []
    for i in range(num_requests):
        rng = random.Random(f"{seed}/request/{i}")
        plen, olen = prompt_len.sample(rng), output_len.sample(rng)
        if max_model_len is not None:
            plen = min(plen, max_model_len - 1)
            olen = min(olen, max_model_len - plen)
        prompt = make_prompt(plen, vocab, rng, repetitive)
        specs.append(RequestSpec(i, arrivals[i], tuple(prompt), olen, rng.randrange(2**63)))
    return specs


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

    def itl_s(self) -> list[float]:
        """Per-token inter-token latencies: the gap before each later message divided by its
        tokens, once per token. Weighting by tokens makes the mean the stream's decode time per
        token, and a step that accepted drafts counts as the faster tokens it produced."""
        out: list[float] = []
        for (prev, _), (now, n) in pairwise(self.messages):
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
