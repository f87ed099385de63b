"""The probe runs of the `determinism` phase: one probe request alone, then the same probe
inside a mixed batch, through the runner's two callbacks.

The mixed run changes everything a batch-dependent kernel could see: companions of other
lengths join one per step (so steps mix prefills, chunks and decodes), the probe's prompt is
cut at another point, and with speculation the probe verifies drafts taken from its own
alone output, one of them wrong every other step, so it accepts a different number per step
than it decodes alone. The runner's outputs are followed as the serving scheduler follows
them (serving.step_output): only accepted drafts count as computed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from warmgate.server.config.runner_config import cdiv
from warmgate.server.runner.scheduler_output import SamplingParams
from warmgate.server.serving.step_output import advance_computed, build_scheduler_output
from warmgate.server.warmup.steps import ExecuteModel, SampleTokens


@dataclass
class ProbeRequest:
    """A request as the driver tracks it (serving.step_output's TrackedRequest)."""

    req_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    max_new_tokens: int
    output_token_ids: list[int] = field(default_factory=list)
    # (token, logprob, rank) per output token: what the comparison reads.
    logprobs: list[tuple[int, float, int]] = field(default_factory=list)
    num_computed_tokens: int = 0
    block_ids: list[int] = field(default_factory=list)
    num_blocks_sent: int = 0
    in_runner: bool = False
    # The probe's alone output, its drafts' source in the mixed run (empty: no drafts).
    draft_source: list[int] = field(default_factory=list)

    @property
    def prefilling(self) -> bool:
        return self.num_computed_tokens < len(self.prompt_token_ids)

    @property
    def done(self) -> bool:
        return len(self.output_token_ids) >= self.max_new_tokens


@dataclass(frozen=True)
class Budget:
    block_size: int
    max_num_reqs: int
    max_num_tokens: int
    num_spec_steps: int
    vocab_size: int


class ProbeDriver:
    """Runs steps over ProbeRequests; KV blocks are handed out from 1 up and reused by the
    next run (each run finishes its requests first)."""

    def __init__(self, execute: ExecuteModel, sample: SampleTokens, budget: Budget) -> None:
        self._execute, self._sample, self.budget = execute, sample, budget
        self._next_block = 1
        self._finished: set[str] = set()
        self.steps = 0
        self.tokens = 0

    def step(self, work: Sequence[tuple[ProbeRequest, int, tuple[int, ...]]]) -> None:
        bs = self.budget.block_size
        for req, n, _ in work:
            need = cdiv(req.num_computed_tokens + n, bs) - len(req.block_ids)
            req.block_ids += range(self._next_block, self._next_block + max(need, 0))
            self._next_block += max(need, 0)
        so = build_scheduler_output(work, self._finished)
        self._finished = set()
        self._execute(so)
        out = self._sample(None)
        self.steps += 1
        self.tokens += so.total_num_scheduled_tokens
        if out is None:
            return
        by_id = {req.req_id: (req, n, d) for req, n, d in work}
        for i, (rid, tokens) in enumerate(zip(out.req_ids, out.sampled_token_ids, strict=True)):
            req, n, drafts = by_id[rid]
            advance_computed(req, n, len(drafts), tokens)
            req.output_token_ids += tokens
            if out.logprobs is not None:
                req.logprobs += [(t.token_id, t.logprob, t.rank) for t in out.logprobs[i]]

    def retire(self, req: ProbeRequest) -> None:
        """req is done: the runner drops it with the next step, freeing its slot."""
        if req.in_runner:
            self._finished.add(req.req_id)
            req.in_runner = False

    def end_run(self, reqs: Sequence[ProbeRequest]) -> None:
        """Finish every request (the runner drops them) and free the blocks for the next."""
        self._finished |= {r.req_id for r in reqs if r.in_runner}
        if self._finished:
            self._execute(build_scheduler_output([], self._finished))
        self._finished = set()
        self._next_block = 1

    def run_alone(self, probe: ProbeRequest) -> None:
        """The whole prompt in as few chunks as the token budget allows, then one plain
        decode a step."""
        while not probe.done:
            n = (min(len(probe.prompt_token_ids) - probe.num_computed_tokens,
                     self.budget.max_num_tokens) if probe.prefilling else 1)
            self.step([(probe, n, ())])
        self.end_run([probe])

    def run_mixed(self, probe: ProbeRequest, companions: Sequence[ProbeRequest]) -> None:
        """The probe with companions joining one a step (see the module's docstring)."""
        waiting = list(companions)
        running: list[ProbeRequest] = [probe]
        first_cut = max(1, cdiv(len(probe.prompt_token_ids), 2) - 1)
        while not probe.done:
            for req in [r for r in running if r.done]:
                self.retire(req)
            running = [r for r in running if not r.done]
            if waiting and len(running) < self.budget.max_num_reqs:
                running.append(waiting.pop(0))
            left = self.budget.max_num_tokens
            work: list[tuple[ProbeRequest, int, tuple[int, ...]]] = []
            for req in running:
                drafts: tuple[int, ...] = ()
                if req.prefilling:
                    remaining = len(req.prompt_token_ids) - req.num_computed_tokens
                    if req is probe and req.num_computed_tokens == 0:
                        remaining = min(remaining, first_cut)
                    n = min(remaining, left)
                else:
                    drafts = self._drafts(req)[:max(left - 1, 0)]
                    n = 1 + len(drafts)
                if 0 < n <= left:
                    work.append((req, n, drafts))
                    left -= n
            self.step(work)
        self.end_run([probe, *companions])

    def _drafts(self, req: ProbeRequest) -> tuple[int, ...]:
        """The next tokens of the probe's alone output, the second one wrong every other
        step; never past its max_new_tokens (the bonus token included)."""
        j = len(req.output_token_ids)
        k = min(self.budget.num_spec_steps, req.max_new_tokens - j - 1,
                len(req.draft_source) - j)
        if k <= 0:
            return ()
        drafts = list(req.draft_source[j:j + k])
        if k >= 2 and self.steps % 2:
            drafts[1] = (drafts[1] + 1) % self.budget.vocab_size
        return tuple(drafts)
