"""The `structured` phase: structured output's grammar path, warmed before ready.

A Generate request with a JSON schema, regex or EBNF grammar takes paths no other request
takes: xgrammar's TokenizerInfo (a scan of the whole vocabulary, built once), the grammar
compiler, the matcher's bitmask filling, the runner's bitmask buffers (allocated on first use)
and the apply kernel (Triton on CUDA, compiled per specialization of its row count). This
phase runs all of them: it compiles a small JSON schema (and a regex and an EBNF grammar, whose
front ends convert to xgrammar's grammar on their own paths), then drives the runner through a
prefill and the decode plan of kernels.decode (with speculation: with and without drafts)
where every other request is constrained beside plain ones, each sampled step carrying a
GrammarOutput as the serving loop builds it; then, on CUDA, the apply kernel at every logits
row count a step can have (1 .. max_num_seqs * (1 + k)), as sampler_rows does for the
sampler. A model without a tokenizer (or EOS ids) can never get a grammar request: SKIPPED.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import torch

from warmgate.server.core.phases import STRUCTURED
from warmgate.server.core.progress import PhaseProgress, ProgressCallback
from warmgate.server.core.results import PhaseResult, PhaseStatus, SkipReason
from warmgate.server.runner.sampling.grammar_mask import apply_token_bitmask
from warmgate.server.runner.scheduler_output import GREEDY, GrammarOutput, SchedulerOutput
from warmgate.server.serving.grammar.spec import GrammarSpec, grammar_unavailable_reason
from warmgate.server.text.model_text import ModelText, load_model_text
from warmgate.server.warmup.kernels import decode_plan
from warmgate.server.warmup.sampler_paths import STOCHASTIC
from warmgate.server.warmup.steps import (
    BlockAllocator,
    ExecuteModel,
    SampleTokens,
    WarmupRequest,
    decode_step,
    finish,
    kv_block_sizes,
    prefill_step,
    synced_timer,
    warmup_shapes,
)

# Small, but with every construct the schema compiler and matcher handle differently.
WARMUP_SCHEMA = json.dumps({
    "type": "object",
    "properties": {"id": {"type": "integer"}, "name": {"type": "string"},
                   "kind": {"enum": ["a", "b"]},
                   "tags": {"type": "array", "items": {"type": "string"}}},
    "required": ["id", "name"]})

# Each of the other kinds' front ends once (the serving path compiles every kind alike).
WARMUP_OTHER_KINDS = (GrammarSpec("regex", r"(yes|no), [0-9]{2}!"),
                      GrammarSpec("ebnf", 'root ::= "[" item ("," item)? "]"\n'
                                          'item ::= "red" | [0-9]'))


class _ConstrainedSteps:
    """execute/sample callables that give every constrained request of a step its bitmask
    rows (1 + its drafts), filled from one matcher, as the serving loop would."""

    def __init__(self, model_runner: Any, execute: ExecuteModel, sample: SampleTokens,
                 grammar: Any, constrained: set[str]) -> None:
        self._runner = model_runner
        self._execute, self._sample = execute, sample
        self._grammar, self._constrained = grammar, constrained
        self._last: SchedulerOutput | None = None
        self.num_constrained_rows = 0

    def execute(self, so: SchedulerOutput) -> Any:
        self._last = so
        return self._execute(so)

    def sample(self, _: GrammarOutput | None) -> Any:
        so = self._last
        ids = [r for r in (so.num_scheduled_tokens if so else {})
               if r in self._constrained and so is not None and self._samples(so, r)]
        if so is None or not ids:
            return self._sample(None)
        drafts = [so.scheduled_spec_decode_tokens.get(r, []) for r in ids]
        rows = sum(1 + len(d) for d in drafts)
        bitmask = torch.full((rows, self._grammar.bitmask_width), -1, dtype=torch.int32)
        start = 0
        for d in drafts:
            self._grammar.fill_rows(bitmask, start, d)
            start += 1 + len(d)
        self.num_constrained_rows += rows
        return self._sample(GrammarOutput(ids, bitmask))


    def _samples(self, so: SchedulerOutput, req_id: str) -> bool:
        """Whether the step reaches the end of the tokens the runner holds for the request
        (a decode the warmup restated to its prompt's end samples nothing)."""
        cached = so.scheduled_cached_reqs
        computed = (cached.num_computed_tokens[cached.req_ids.index(req_id)]
                    if req_id in cached.req_ids else 0)
        inputs = (so.num_scheduled_tokens[req_id]
                  - len(so.scheduled_spec_decode_tokens.get(req_id, ())))
        held: int = self._runner.input_batch.requests[req_id].num_tokens
        return computed + inputs >= held


def _sweep_rows(model_runner: Any, width: int) -> int:
    """The apply kernel at every logits row count a step can hand the sampler."""
    max_rows: int = model_runner.token_bitmask.max_rows
    vocab = model_runner.config.model.vocab_size
    logits = torch.zeros(max_rows, vocab, device=model_runner.device, dtype=torch.float32)
    bitmask = torch.full((max_rows, width), -1, dtype=torch.int32, device=model_runner.device)
    for n in range(1, max_rows + 1):
        apply_token_bitmask(logits[:n], bitmask[:n])
    return max_rows


def run_structured_warmup(model_runner: Any, execute: ExecuteModel, sample: SampleTokens, *,
                          text: ModelText | None = None,
                          progress: ProgressCallback | None = None,
                          req_id_prefix: str = "_warmup_structured") -> PhaseResult:
    """`text` defaults to what the model directory holds (read again here)."""
    if model_runner.is_pooling_model:
        return PhaseResult.skipped(STRUCTURED, SkipReason.POOLING_MODEL,
                                   "a pooling model never samples")
    text = text if text is not None else load_model_text(model_runner.config.model)
    reason = grammar_unavailable_reason(text)
    if reason is not None:
        return PhaseResult.skipped(STRUCTURED, SkipReason.NO_TOKENIZER, reason)
    from warmgate.server.serving.grammar.backend import grammar_backend  # loads xgrammar

    shapes = warmup_shapes(model_runner)
    num_reqs, prompt_len = shapes["num_reqs"], shapes["prompt_len"]
    num_spec = model_runner.num_speculative_steps
    block_sizes = kv_block_sizes(model_runner)
    plan = decode_plan(num_reqs, num_spec)
    on_cuda = model_runner.device.type == "cuda"
    tracker = PhaseProgress(STRUCTURED, 2 + len(plan) + int(on_cuda), progress)
    reqs = [WarmupRequest(f"{req_id_prefix}_{i}", prompt_len) for i in range(num_reqs)]
    # Every other request constrained, beside plain ones, greedy and stochastic both.
    constrained = {r.req_id for i, r in enumerate(reqs) if i % 2 == 0}
    params = [GREEDY if i % 4 < 2 else STOCHASTIC for i in range(num_reqs)]
    swept = 0
    with synced_timer(model_runner) as t:
        backend = grammar_backend(text, model_runner.config.model.vocab_size)
        grammar = backend.matcher(GrammarSpec("json_schema", WARMUP_SCHEMA))
        for spec in WARMUP_OTHER_KINDS:
            backend.matcher(spec).fill_rows(
                torch.full((1, grammar.bitmask_width), -1, dtype=torch.int32), 0, ())
        tracker.step()
        steps = _ConstrainedSteps(model_runner, execute, sample, grammar, constrained)
        tokens = _run_steps(steps, reqs, params, plan, num_spec, block_sizes,
                            shapes["tokens_per_req"], tracker)
        if on_cuda:
            swept = _sweep_rows(model_runner, grammar.bitmask_width)
            tracker.step()
    return PhaseResult(
        name=STRUCTURED, status=PhaseStatus.RAN, duration_s=t[0], num_reqs=num_reqs,
        num_tokens=tokens, num_steps=tracker.steps_done,
        shapes={**shapes, "grammar_kinds": ["json_schema", *(g.kind for g in WARMUP_OTHER_KINDS)],
                "constrained_reqs": len(constrained),
                "constrained_rows": steps.num_constrained_rows, "apply_row_counts": swept,
                "vocab_size": backend.vocab_size},
        detail=f"compiled a JSON schema, a regex and an EBNF grammar; {len(constrained)} of "
               f"{num_reqs} requests "
               f"constrained through a prefill and {len(plan)} decode steps"
               + (f"; the bitmask kernel at 1..{swept} rows" if swept else ""))


def _run_steps(steps: _ConstrainedSteps, reqs: Sequence[WarmupRequest],
               params: list[Any], plan: list[list[tuple[int, bool]]], num_spec: int,
               block_sizes: list[int], tokens_per_req: int, tracker: PhaseProgress) -> int:
    alloc = BlockAllocator(len(block_sizes))
    tokens = 0
    try:
        prefill_step(steps.execute, steps.sample, reqs, alloc, block_sizes, params,
                     is_pooling=False)
        tokens += sum(r.prompt_len for r in reqs)
        tracker.step()
        for rows in plan:
            tokens += decode_step(steps.execute, steps.sample, reqs, rows, num_spec, alloc,
                                  block_sizes, tokens_per_req)[0]
            tracker.step()
    finally:
        finish(steps.execute, [r.req_id for r in reqs])
    return tokens
