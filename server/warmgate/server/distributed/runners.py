"""The model runner of each rank at TP > 1.

Rank 0's `TensorParallelRunner` is the runner the server drives: before each call that runs
the forward (a step, a graph capture, a JIT warmup, the collectives warmup) it sends the call
to the workers, so every rank runs the same forward, with the same collectives, in the same
order. Only rank 0 samples; the tokens it sampled travel with the next call, and each
worker's `WorkerRunner` appends them to its request states as rank 0 did. Rank 0's JIT
readiness travels with every call too, so a worker tells a compile, a CUDA-graph miss or a
communicator set-up after ready from the plan's own; the worker's events come back through
replies.py into rank 0's JIT monitor.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

import torch.distributed as dist

from warmgate.server.config.runner_config import RunnerConfig
from warmgate.server.distributed.collectives_warmup import collective_plan, warm_collectives
from warmgate.server.distributed.workers import WorkerGroup
from warmgate.server.jit import JitMonitor
from warmgate.server.runner.model_runner import ModelRunner
from warmgate.server.runner.scheduler_output import (
    GrammarOutput,
    ModelRunnerOutput,
    SchedulerOutput,
)
from warmgate.server.runner.tensor_parallel import TensorParallel
from warmgate.server.runner.validation import validate_scheduler_output

# Sampled token ids by request, as rank 0 appended them (None: no step was sampled).
Sampled = dict[str, list[int]] | None


class TensorParallelRunner(ModelRunner):
    def __init__(self, config: RunnerConfig, workers: WorkerGroup, tp: TensorParallel,
                 jit_monitor: JitMonitor | None = None) -> None:
        self.workers = workers
        self._sampled: Sampled = None
        # The rendezvous store (build.py); it must live as long as the process group.
        self.store: Any = None
        super().__init__(config, jit_monitor=jit_monitor, tensor_parallel=tp)
        workers.replies.relay_to(self.jit_monitor.relay)
        backend_warmup = self.attention_backend.jit_warmup

        def jit_warmup() -> Any:  # the flashinfer phase: every rank JIT-compiles its own
            self._send("jit_warmup")
            return backend_warmup()

        self.attention_backend.jit_warmup = jit_warmup  # type: ignore[method-assign]

    def _send(self, method: str, *args: Any) -> None:
        sampled, self._sampled = self._sampled, None
        self.workers.send((method, args, sampled, self.jit_monitor.ready))

    def tell_workers(self, program: str) -> None:
        """Have every worker run one of its programs (WorkerRunner.programs) that runs no
        forward: sent, not waited for; each worker runs it before the next call."""
        self._send(program)

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput | None:
        # Refused here, before the workers see it, so a bad step never reaches them.
        if self._pending is not None:
            raise RuntimeError("execute_model called twice without sample_tokens in between")
        validate_scheduler_output(scheduler_output, self.input_batch.requests, self.limits)
        self._send("execute_model", scheduler_output)
        return super().execute_model(scheduler_output)

    def sample_tokens(self, grammar_output: GrammarOutput | None) -> ModelRunnerOutput | None:
        out = super().sample_tokens(grammar_output)
        if out is not None:
            self._sampled = {r: list(t) for r, t in zip(out.req_ids, out.sampled_token_ids,
                                                        strict=True) if t}
        return out

    def capture_cuda_graphs(self) -> dict[str, object]:
        self._send("capture_cuda_graphs")
        return super().capture_cuda_graphs()

    def close(self) -> None:
        """Stop the workers and leave the process group (the server's stop, tests)."""
        self.workers.close()
        if dist.is_initialized():
            dist.destroy_process_group()

    def warm_collectives(self) -> tuple[dict[str, Any], list[float]]:
        """The distributed phase: its plan and every rank's seconds."""
        plan = collective_plan(self)
        self._send("warm_collectives", plan)
        assert self.tensor_parallel is not None  # set by the constructor; narrows the type
        seconds = warm_collectives(self.tensor_parallel, self, plan)
        if self.device.type == "cuda" and self.config.compilation.shape_sweeps:
            # The compile phase sweeps rank 0's GEMM shapes; the workers sweep theirs now,
            # beside it (no collective in a sweep), so no rank meets a new shape after ready.
            self._send("sweep_gemm_shapes")
        return plan, seconds


class WorkerRunner(ModelRunner):
    """A worker rank's runner: runs what rank 0 sends, never samples. `programs` are the
    calls that need layers above the runner (the GEMM sweep of the warmup plan): the worker
    program hands them in, so this package imports nothing above it."""

    programs: Mapping[str, Callable[[WorkerRunner], object]] = MappingProxyType({})

    def apply_sampled(self, sampled: Sampled) -> None:
        """Close the pending step with rank 0's tokens (rank 0 has sampled it by now)."""
        pending, self._pending = self._pending, None
        if pending is None or not sampled:
            return
        for s in pending.scheduled:
            tokens = sampled.get(s.req_id)
            if tokens:
                s.state.output_token_ids.extend(tokens)

    def handle(self, method: str, args: tuple[Any, ...], sampled: Sampled,
               ready: bool = False) -> None:
        """One call from rank 0; `ready`: whether rank 0's JIT monitor was ready when it sent
        it (what this rank's events count as)."""
        self.jit_monitor.follow(ready)
        self.apply_sampled(sampled)
        if method == "execute_model":
            self.execute_model(*args)
        elif method == "capture_cuda_graphs":
            self.capture_cuda_graphs()
        elif method == "jit_warmup":
            self.attention_backend.jit_warmup()
        elif method == "warm_collectives":
            assert self.tensor_parallel is not None
            warm_collectives(self.tensor_parallel, self, *args)
        elif method in self.programs:
            self.programs[method](self)
        else:
            raise ValueError(f"rank {self.config.parallel.rank}: unknown call {method!r}")
