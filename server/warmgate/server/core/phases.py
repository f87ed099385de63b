"""The warmup plan's phase names, in the order the plan runs them.

The plan, the controller (progress and ETA), the metrics' label set, the fault injector and
the tests all name phases; they import them from here so a renamed or added phase cannot
drift between them. Nothing here imports torch, so naming a phase costs nothing.
"""

from __future__ import annotations

LOAD = "load"
FLASHINFER = "flashinfer"
COMPILE = "compile"
# The fused MoE kernel: a launch per token-count bucket (autotuned on CUDA) and its compiles.
MOE = "moe"
PREFILL = "kernels.prefill"
DECODE = "kernels.decode"
SAMPLER = "kernels.sampler"
STRUCTURED = "structured"
MIXED = "mixed"
CUDA_GRAPHS = "cuda_graphs"
# --deterministic only: a probe alone and inside a mixed batch must give the same bits.
DETERMINISM = "determinism"

# A whole plan (WarmupKernels, start-up), in order: the phases that vary only what runs
# after the forward (the sampler, the grammar's bitmask) come after the CUDA graphs
# (warmup/plan.py says why); moe before any phase runs a forward, so none autotunes; the
# determinism check last, over every path warmed.
PLAN_PHASES = (LOAD, FLASHINFER, MOE, COMPILE, PREFILL, DECODE, MIXED, CUDA_GRAPHS, SAMPLER,
               STRUCTURED, DETERMINISM)
# Only a tensor-parallel runner (warmgate.server.distributed) runs this one, right after load
# (every collective at every size class, on every rank); a TP=1 plan is PLAN_PHASES.
DISTRIBUTED = "distributed"
TP_PLAN_PHASES = (LOAD, DISTRIBUTED, *PLAN_PHASES[1:])
# Not a plan phase: after the first plan that succeeds, requests go through Generate before
# health turns SERVING (warmgate.server.api.rehearsal); a report names it only when it failed.
SERVING_REHEARSAL = "serving_rehearsal"
# A MixedWarmup call runs only this one.
MIXED_PHASES = (MIXED,)
# The phases whose work goes through the runner's two callbacks (execute_model and
# sample_tokens), in plan order; load runs before a runner exists, and flashinfer, compile and
# cuda_graphs skip on a CPU (structured too, without a tokenizer), so only these can be
# interrupted through the callbacks.
RUNNER_CALL_PHASES = (PREFILL, DECODE, MIXED, SAMPLER)
