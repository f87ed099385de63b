"""The batch classes the first-request diagnostics time, and the Case that builds their
requests and times their steps (shared by every runner-level mode of first_request.py)."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from warmgate.server.devtools.batch_driver import BatchDriver, DrivenRequest, Work
from warmgate.server.runner.scheduler_output import GREEDY, SamplingParams
from warmgate.server.warmup.kernels import SEEDED, STOCHASTIC
from warmgate.server.warmup.sampler_rows import TEMPERATURE_ONLY  # no top-k/top-p

# A decode's untimed set-up prefills PROMPT_LEN - 1 = 32 tokens per request: a compile bucket
# (32, 128) that none of the timed steps (4, 16, 96 tokens) uses, so set-up warms nothing
# that a timed first batch would otherwise pay for.
PROMPT_LEN = 33
NUM_REQS = 4


def sync(driver: BatchDriver) -> None:
    if driver.runner.device.type == "cuda":
        torch.cuda.synchronize(driver.runner.device)


class Case:
    """Builds requests with ids unique per case, so cases can share one driver, and times
    steps, each after `gap_s` of idleness."""

    def __init__(self, sched: BatchDriver, name: str, rng: random.Random,
                 gap_s: float = 0.0) -> None:
        self.sched, self.name, self.rng, self.gap_s = sched, name, rng, gap_s
        self._n = 0

    def timed(self, plan: dict[str, Work]) -> float:
        sync(self.sched)
        if self.gap_s:
            time.sleep(self.gap_s)
        start = time.perf_counter()
        self.run_step(plan)
        return time.perf_counter() - start

    def run_step(self, plan: dict[str, Work]) -> None:
        """The timed part: the step and the sync that ends it (a subclass may wrap it)."""
        self.sched.step(plan)
        sync(self.sched)

    def request(self, prompt_len: int, params: SamplingParams) -> DrivenRequest:
        self._n += 1
        vocab = self.sched.runner.config.model.vocab_size
        req = DrivenRequest(f"{self.name}{self._n}",
                            [self.rng.randrange(vocab) for _ in range(prompt_len)], params,
                            10**6)
        self.sched.add(req)
        return req

    def drafts(self, k: int) -> tuple[int, ...]:
        vocab = self.sched.runner.config.model.vocab_size
        return tuple(self.rng.randrange(vocab) for _ in range(k))

    def finish(self, reqs: list[DrivenRequest]) -> None:
        for r in reqs:
            self.sched.finish(r.req_id)


def prefill_requests(case: Case, num_tokens: int = 24, num_reqs: int = NUM_REQS
                     ) -> tuple[list[DrivenRequest], dict[str, Work]]:
    """num_reqs new requests of num_tokens, and the step that prefills them whole."""
    reqs = [case.request(num_tokens, STOCHASTIC) for _ in range(num_reqs)]
    return reqs, {r.req_id: Work(num_tokens) for r in reqs}


def decode_set(case: Case, params: SamplingParams = STOCHASTIC) -> list[DrivenRequest]:
    """NUM_REQS requests with all but the last prompt token computed (untimed), so nothing
    is sampled before the first timed decode."""
    reqs = [case.request(PROMPT_LEN, params) for _ in range(NUM_REQS)]
    case.sched.step({r.req_id: Work(PROMPT_LEN - 1) for r in reqs})
    return reqs


def decode_plan(case: Case, reqs: list[DrivenRequest], k: int) -> dict[str, Work]:
    """The last token (+ k drafts) of each: a uniform decode that samples."""
    return {r.req_id: Work(1 + k, case.drafts(k)) for r in reqs}


def prefill(case: Case, repeats: int) -> list[float]:
    times = []
    for _ in range(repeats + 1):
        reqs, plan = prefill_requests(case)
        times.append(case.timed(plan))
        case.finish(reqs)
    return times


def decode(params: SamplingParams, k: int) -> Callable[[Case, int], list[float]]:
    """Untimed: each prompt but its last token; timed: the last prompt token (+ k drafts),
    then more decodes."""

    def run(case: Case, repeats: int) -> list[float]:
        reqs = decode_set(case, params)
        times = [case.timed(decode_plan(case, reqs, k)) for _ in range(repeats + 1)]
        case.finish(reqs)
        return times

    return run


def mixed(case: Case, repeats: int) -> list[float]:
    """One request decoding beside a new 15-token prefill, as the warmup's mixed step."""
    decoding = case.request(PROMPT_LEN, STOCHASTIC)
    case.sched.step({decoding.req_id: Work(PROMPT_LEN - 1)})
    times = []
    for _ in range(repeats + 1):
        fresh = case.request(15, STOCHASTIC)
        times.append(case.timed({decoding.req_id: Work(1), fresh.req_id: Work(15)}))
        case.finish([fresh])
    case.finish([decoding])
    return times


@dataclass(frozen=True)
class BatchClass:
    name: str
    num_spec: int  # the runner it needs
    run: Callable[[Case, int], list[float]]


CLASSES = (
    BatchClass("prefill", 0, prefill),
    BatchClass("decode k=0", 0, decode(STOCHASTIC, 0)),
    BatchClass("mixed", 0, mixed),
    BatchClass("sampler greedy", 0, decode(GREEDY, 0)),
    BatchClass("sampler temperature", 0, decode(TEMPERATURE_ONLY, 0)),
    BatchClass("sampler seeded", 0, decode(SEEDED, 0)),
    BatchClass("decode k=3", 3, decode(STOCHASTIC, 3)),
)


def pick_classes(text: str | None, served: tuple[BatchClass, ...] = CLASSES,
                 why: str = "") -> tuple[BatchClass, ...]:
    """The classes a comma-separated --classes names, in CLASSES order (all when None); an
    unknown name exits with the choices."""
    if not text:
        return served
    names = [n.strip() for n in text.split(",")]
    unknown = [n for n in names if n not in {c.name for c in served}]
    if unknown:
        raise SystemExit(f"--classes: {unknown} not among {[c.name for c in served]}{why}")
    return tuple(c for c in served if c.name in names)
