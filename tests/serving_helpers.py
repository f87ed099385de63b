"""Drive the serving loop over a real tiny runner, and the reference it is checked against."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from tests.runner_helpers import MiniScheduler
from warmgate.server.runner.model_runner import ModelRunner
from warmgate.server.runner.scheduler_output import SamplingParams, SchedulerOutput
from warmgate.server.serving.limits import SchedulerLimits
from warmgate.server.serving.loop import ServingLoop, StepStats
from warmgate.server.serving.ngram import NgramIndex
from warmgate.server.serving.request import ServingRequest, StepEvent
from warmgate.server.serving.scheduler import Scheduler


def greedy(max_tokens: int, stop: Sequence[int] = ()) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, stop_token_ids=tuple(stop))


class Served:
    """A ServingLoop over `runner` that records every step's SchedulerOutput and event."""

    def __init__(self, runner: ModelRunner, *, async_scheduling: bool = False) -> None:
        self.runner = runner
        self.events: list[StepEvent] = []
        self.steps: list[SchedulerOutput] = []
        self.scheduler = Scheduler(SchedulerLimits.of_config(
            runner.config, async_scheduling=async_scheduling))
        self.stats: list[StepStats] = []
        self.loop = ServingLoop(runner, self.scheduler, self.events.extend,
                                on_step=self.stats.append)
        original = runner.execute_model

        def recording(so: SchedulerOutput) -> Any:
            if so.num_scheduled_tokens:
                self.steps.append(so)
            return original(so)

        runner.execute_model = recording  # type: ignore[method-assign]

    def submit(self, req_id: str, prompt: Sequence[int], params: SamplingParams
               ) -> ServingRequest:
        k = self.runner.num_speculative_steps
        req = ServingRequest(req_id, list(prompt), params, time.perf_counter(),
                             NgramIndex(1, 4) if k else None)
        self.loop.submit(req)
        return req

    def run(self) -> None:
        self.loop.run(lambda: False)


def reference_greedy(runner: ModelRunner, prompt: Sequence[int], max_tokens: int) -> list[int]:
    """Plain decoding, one request alone: the whole prompt in one step, then one token a
    step, each fed back (the loop a Generate must reproduce exactly)."""
    sched = MiniScheduler(runner)
    sched.add("ref", list(prompt), greedy(max_tokens))
    for _ in range(max_tokens):
        sched.step()
    tokens = list(sched.tokens("ref"))
    sched.finish("ref")
    runner.execute_model(sched.schedule(num_tokens={}))  # drop the request
    return tokens
