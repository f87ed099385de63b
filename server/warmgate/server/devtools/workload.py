"""The Generate load benches' workload: length distributions and the seeded requests they
replay (results and their statistics: load_stats). No gRPC and no torch here, so the unit
tests and any offline analysis import it cheaply.

Distributions are text, so a bench command line says what it replays:
`fixed:128`, `uniform:16:256` (integers, both ends included), `normal:128:32` (rounded to an
integer, clamped to >= 1).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

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
