"""The server's steps over a stretch of serving, by kind, from two scrapes of its /metrics:
how many decode, mixed (prompt chunks beside decodes) and prefill steps ran, their mean time
and the prompt tokens each carried. A decoding stream's next token waits for its whole step,
so the mixed steps' time against the decode steps' is where an inter-token latency tail comes
from, and the prompt tokens per mixed step say what --max-prefill-tokens-while-decoding let in.

Under --async-scheduling a step's time spans its launch to its tokens read, so it holds part
of the step before it: the means compare the kinds, they do not add up to the wall time.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

DURATION = "warmgate_step_duration_seconds"
PROMPT_TOKENS = "warmgate_step_prompt_tokens_total"


@dataclass(frozen=True)
class KindTotals:
    steps: float
    seconds: float
    prompt_tokens: float

    def __sub__(self, other: KindTotals) -> KindTotals:
        return KindTotals(self.steps - other.steps, self.seconds - other.seconds,
                          self.prompt_tokens - other.prompt_tokens)


def step_totals(metrics_text: str) -> dict[str, KindTotals]:
    """Each kind's step count, summed seconds and prompt tokens so far."""
    count: dict[str, float] = {}
    total_s: dict[str, float] = {}
    prompt: dict[str, float] = {}
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            kind = sample.labels.get("kind")
            if kind is None:
                continue
            if sample.name == DURATION + "_count":
                count[kind] = sample.value
            elif sample.name == DURATION + "_sum":
                total_s[kind] = sample.value
            elif sample.name == PROMPT_TOKENS:
                prompt[kind] = sample.value
    return {kind: KindTotals(n, total_s.get(kind, 0.0), prompt.get(kind, 0.0))
            for kind, n in count.items()}


def between(before: dict[str, KindTotals], after: dict[str, KindTotals]
            ) -> dict[str, KindTotals]:
    """What ran between two scrapes, each kind the later one holds."""
    empty = KindTotals(0.0, 0.0, 0.0)
    return {kind: totals - before.get(kind, empty) for kind, totals in after.items()}


def describe(totals: dict[str, KindTotals]) -> str:
    """One line: each kind that ran, its steps, mean ms and prompt tokens a step."""
    parts = []
    for kind, t in totals.items():
        if t.steps <= 0:
            continue
        part = f"{kind} {t.steps:.0f} (mean {t.seconds / t.steps * 1e3:.2f} ms"
        if t.prompt_tokens:
            part += f", {t.prompt_tokens / t.steps:.0f} prompt tokens each"
        parts.append(part + ")")
    return "steps: " + ("; ".join(parts) if parts else "none")
