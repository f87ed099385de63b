"""The model runner: vLLM's execute_model / sample_tokens contract over our Llama decoder.

The constructor reads as the start-up order: checked config -> model and weights -> paged KV
cache -> attention backend -> forward (wrapped for torch.compile when asked) -> sampler, input
buffers and step limits. Compiling itself and graph capture come later, from warmup, over
`_run_model`.
Attribute names are vLLM MRV2's, so warmup written against vLLM reads this runner unchanged.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from warmgate.server.config.runner_config import RunnerConfig
from warmgate.server.jit import BatchShape, JitMonitor
from warmgate.server.jit.events import COMMUNICATOR_SETUP, CUDA_GRAPH_MISS
from warmgate.server.runner.async_output import AsyncModelOutput, DeviceTokens
from warmgate.server.runner.attention import AttentionSpec, create_backend
from warmgate.server.runner.attention.base import AttentionMetadata
from warmgate.server.runner.batch import BatchKind
from warmgate.server.runner.cuda_graphs import CudaGraphRunner
from warmgate.server.runner.default_ops import default_ops, sampler_warper_ops
from warmgate.server.runner.input_batch import InputBatch, StepInputs, padded_tokens
from warmgate.server.runner.linear_tuning import choose_linears
from warmgate.server.runner.loading import allocate_kv, load_model, load_stats
from warmgate.server.runner.moe_tuning import attach_moe_tuning
from warmgate.server.runner.ops import TorchOps
from warmgate.server.runner.pooling import pool_last_tokens
from warmgate.server.runner.request_state import ScheduledRequest
from warmgate.server.runner.runner_settings import RunnerSettings
from warmgate.server.runner.sampling import Sampler
from warmgate.server.runner.sampling.step import (
    host_sampling_reason,
    sample_on_device,
    sample_step,
)
from warmgate.server.runner.sampling.step_logprobs import PromptLogprobs, prompt_logprobs
from warmgate.server.runner.scheduler_output import (
    GREEDY,
    GrammarOutput,
    ModelRunnerOutput,
    SchedulerOutput,
)
from warmgate.server.runner.step_shape import EAGER, StepShape
from warmgate.server.runner.token_bitmask import TokenBitmaskBuffer
from warmgate.server.runner.validation import StepLimits, validate_scheduler_output

if TYPE_CHECKING:
    from warmgate.server.runner.model import LlamaModel
    from warmgate.server.runner.tensor_parallel import TensorParallel

logger = logging.getLogger(__name__)

# (input_ids, positions, kv_caches, meta) -> hidden states: the model, or its compiled form.
ModelForward = Callable[[torch.Tensor, torch.Tensor, list[torch.Tensor], AttentionMetadata],
                        torch.Tensor]


@dataclass
class _PendingStep:
    scheduled: list[ScheduledRequest]
    logits: torch.Tensor  # [num_logits_rows, V] in the model's dtype
    prompt_logprobs: dict[str, PromptLogprobs]


def _require_resolved(config: RunnerConfig) -> None:
    if not config.is_resolved:
        raise ValueError("ModelRunner needs a resolved config (no 'auto' left in device, "
                         "dtype, attention_backend, cache.num_blocks or cuda_graph_sizes): "
                         "call warmgate.server.config.runner_config.resolve_runner_config "
                         "first, or use warmgate.server.runner.build_runner")


class ModelRunner(RunnerSettings):
    def __init__(self, config: RunnerConfig, ops: TorchOps | None = None,
                 jit_monitor: JitMonitor | None = None,
                 tensor_parallel: TensorParallel | None = None,
                 on_model_built: Callable[[ModelRunner], None] | None = None) -> None:
        """`on_model_built` is called once `self.model`'s tensors exist, before the weights
        are read into them, with the settings eager_token_counts reads already in place (the
        warmup starts its dense-GEMM sweep there: gemm_background.start_with_model)."""
        _require_resolved(config)
        self._read_config(config)
        self.ops = ops if ops is not None else default_ops(config)
        # Under tensor parallel (warmgate.server.distributed) this rank's shard of the model,
        # its KV heads in the cache and its heads in the attention backend.
        self.tensor_parallel = tensor_parallel
        # The owner installs the compiler hooks (they are process-wide); the runner only tells
        # the monitor which batch is in flight and when a uniform decode found no graph, and
        # installs the hooks held until the weights are in (JitMonitor.install_pending).
        self.jit_monitor = jit_monitor if jit_monitor is not None else JitMonitor()
        loaded = load_model(config, self.ops, self.device, self.dtype, tensor_parallel,
                            on_built=None if on_model_built is None
                            else lambda model: self._model_built(model, on_model_built))
        self.model = loaded.model
        attach_moe_tuning(self.model, self.jit_monitor, self.max_num_tokens)
        kv = allocate_kv(config, self.device, self.dtype, self.model.layers[0].num_kv_heads)
        self.kv_caches, self.kv_cache_config = kv.kv_caches, kv.kv_cache_config
        self.jit_monitor.install_pending()
        self._attach_attention_backend()
        if tensor_parallel is not None:  # each collective's first use, a communicator set-up
            tensor_parallel.on_first_use = lambda name, seconds: self.jit_monitor.record(
                COMMUNICATOR_SETUP, name=name, seconds=seconds)
        self._choose_forward()
        self.sampler = Sampler(log_softmax=self.ops.log_softmax,
                               row_wise=self.config.numerics.deterministic,
                               warper_ops=sampler_warper_ops(config))
        # Structured output's bitmask rows: 1 per request, 1 + k with drafts, at most.
        self.token_bitmask = TokenBitmaskBuffer(
            min(self.max_num_reqs * self.decode_query_len, self.max_num_tokens),
            config.model.vocab_size, self.device)
        self.input_batch = self._create_input_batch()
        self.device_tokens = DeviceTokens(self.max_num_reqs, self.device, self.ops.log_softmax)
        self.limits = self._step_limits()
        self.load_stats = load_stats(config, loaded, kv)
        # For tests and warmup checks: the last execute_model's logits (grammar-masked in place).
        self.last_logits: torch.Tensor | None = None  # [rows, V], the model's dtype
        self.last_logits_req_ids: list[str] = []
        self._pending: _PendingStep | None = None
        # Set by capture_cuda_graphs (the warmup's last phase); None means every batch is eager.
        self.graph_runner: CudaGraphRunner | None = None

    def _model_built(self, model: LlamaModel,
                     on_model_built: Callable[[ModelRunner], None]) -> None:
        self.model = model
        on_model_built(self)

    def _attach_attention_backend(self) -> None:
        mc, layer = self.config.model, self.model.layers[0]  # the layer has this rank's heads
        self.attention_spec = AttentionSpec(
            num_heads=layer.num_heads, num_kv_heads=layer.num_kv_heads, head_dim=mc.head_dim,
            block_size=self.config.cache.block_size, num_blocks=self.kv_cache_config.num_blocks,
            max_blocks_per_req=self.config.max_blocks_per_req, max_num_reqs=self.max_num_reqs,
            max_num_tokens=self.max_num_tokens, dtype=self.dtype, device=self.device,
            decode_query_len=self.decode_query_len,
            deterministic=self.config.numerics.deterministic)
        self.attention_backend = create_backend(self.config.device.attention_backend,
                                                self.attention_spec)
        self.model.backend = self.attention_backend

    def _choose_forward(self) -> None:
        """The model itself, or with compile on its torch.compile wrapper per token bucket
        (compiled later by the warmup's compile phase)."""
        self._forward: ModelForward = self.model
        if not self.compile_buckets:
            return
        from warmgate.server.runner.compiled_forward import CompiledForward  # torch._dynamo

        self._forward = CompiledForward(self.model, self.compile_buckets)
        logger.info("torch.compile on: %d token buckets %s (compiled by the warmup's "
                    "compile phase)", len(self.compile_buckets), list(self.compile_buckets))

    def _create_input_batch(self) -> InputBatch:
        return InputBatch(
            max_num_reqs=self.max_num_reqs, max_num_tokens=self.max_num_tokens,
            max_blocks_per_req=self.config.max_blocks_per_req,
            block_size=self.config.cache.block_size, decode_query_len=self.decode_query_len,
            device=self.device,
            default_sampling_params=None if self.is_pooling_model else GREEDY)

    def _step_limits(self) -> StepLimits:
        return StepLimits(
            num_blocks=self.kv_cache_config.num_blocks, block_size=self.config.cache.block_size,
            max_blocks_per_req=self.config.max_blocks_per_req, max_num_reqs=self.max_num_reqs,
            max_num_tokens=self.max_num_tokens, max_model_len=self.max_model_len,
            vocab_size=self.config.model.vocab_size,
            num_kv_cache_groups=len(self.kv_cache_config.kv_cache_groups))

    @torch.inference_mode()
    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput | None:
        """Run one step's forward. Generative models keep the logits pending for
        sample_tokens and return None; pooling models return their embeddings here."""
        if self._pending is not None:
            raise RuntimeError("execute_model called twice without sample_tokens in between")
        validate_scheduler_output(scheduler_output, self.input_batch.requests, self.limits)
        scheduled = self.input_batch.update_states(scheduler_output)
        self.last_logits, self.last_logits_req_ids = None, []
        if not scheduled:
            return ModelRunnerOutput([], [], [], []) if self.is_pooling_model else None
        inputs = self.input_batch.prepare_inputs(scheduled, self._shape_for)
        self.device_tokens.fill_inputs(inputs)
        self.jit_monitor.current_batch = self._batch_shape(inputs)
        hidden = self._run_model(inputs)  # [T, H]
        if self.is_pooling_model:
            return pool_last_tokens(hidden, inputs)
        # Every token a logits row (a decode without drafts) is the rows in order: no gather.
        rows = inputs.logits_indices
        logits = self.model.compute_logits(
            hidden if rows.shape[0] == hidden.shape[0] else hidden.index_select(0, rows))
        self.last_logits, self.last_logits_req_ids = logits, inputs.logits_req_ids
        prompt_lp = prompt_logprobs(hidden, scheduled, inputs.meta.query_start_loc_cpu,
                                    self.model.compute_logits, self.max_num_reqs,
                                    self.ops.log_softmax)
        self._pending = _PendingStep(scheduled=scheduled, logits=logits,
                                     prompt_logprobs=prompt_lp)
        return None

    @torch.inference_mode()
    def sample_tokens(self, grammar_output: GrammarOutput | None) -> ModelRunnerOutput | None:
        """Sample (or verify drafts for) the pending step; None when nothing is pending.
        grammar_output (structured output): the step's bitmask rows of constrained requests,
        applied to their logits rows before the choice; None or no request: untouched."""
        pending, self._pending = self._pending, None
        if pending is None:
            return None
        bitmask = self.token_bitmask.layout(
            [s for s in pending.scheduled if s.num_logits_rows], grammar_output)
        return sample_step(self.sampler, pending.logits, pending.scheduled,
                           pending.prompt_logprobs, bitmask)

    @torch.inference_mode()
    def sample_tokens_async(self, grammar_output: GrammarOutput | None
                            ) -> AsyncModelOutput | None:
        """sample_tokens for overlapped scheduling: the tokens stay on the device (the next
        execute_model reads them there) until the output's get(); a step whose sampling must
        read them on the host (drafts, logprobs; every step under tensor parallel, whose
        workers get the tokens with the next call) comes back complete, with the reason."""
        pending = self._pending
        if pending is None:
            return None
        reason = ("tensor_parallel" if self.tensor_parallel is not None
                  else host_sampling_reason(pending.scheduled))
        if reason is not None:
            out = self.sample_tokens(grammar_output)
            return None if out is None else AsyncModelOutput(out, reason)
        self._pending = None
        bitmask = self.token_bitmask.layout(
            [s for s in pending.scheduled if s.num_logits_rows], grammar_output)
        tokens = sample_on_device(self.sampler, pending.logits, pending.scheduled, bitmask)
        return self.device_tokens.launch(tokens, pending.scheduled, ModelRunnerOutput(
            [], [], prompt_logprobs=pending.prompt_logprobs), pending.logits)

    def _shape_for(self, num_reqs: int, num_tokens: int, uniform: bool) -> StepShape:
        """What a step is padded to: a uniform-decode batch the nearest captured size, a
        ragged one its token bucket when those graphs were captured; everything else runs
        eagerly, a ragged batch's tokens rounded up to eager_tokens."""
        if self.graph_runner is not None:
            shape = self.graph_runner.shape_for(num_reqs, num_tokens, uniform)
            if shape is not None:
                return shape
        return StepShape(EAGER, num_tokens if uniform else self.eager_tokens(num_tokens),
                         num_reqs)

    def _run_model(self, inputs: StepInputs) -> torch.Tensor:
        """The forward pass over the step's own rows [T, H]: a replay of the graph its inputs
        were staged for, or eager (over the padded tokens, when there are)."""
        meta, shape = inputs.meta, inputs.shape
        if self.graph_runner is not None and shape.is_graph:
            return self.graph_runner.replay(shape, inputs.views)[:meta.num_tokens]
        if self.graph_runner is not None and meta.is_uniform_decode and self.graph_runner.captured:
            self.jit_monitor.record(CUDA_GRAPH_MISS, name=f"{meta.num_reqs} requests")
        input_ids, positions, padded = padded_tokens(inputs)
        self.attention_backend.plan(padded)
        return self._eager_forward(input_ids, positions, padded)[:meta.num_tokens]

    def _eager_forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                       meta: AttentionMetadata) -> torch.Tensor:
        """The forward outside a graph replay (compiled per bucket when compile is on)."""
        return self._forward(input_ids, positions, self.kv_caches, meta)

    def _batch_shape(self, inputs: StepInputs) -> BatchShape:
        """classify_batch's answer, from what prepare_inputs already worked out."""
        meta = inputs.meta
        kind = (BatchKind.UNIFORM_DECODE if meta.is_uniform_decode
                else BatchKind.PREFILL if inputs.all_prefill else BatchKind.MIXED)
        return BatchShape(kind.value, meta.num_reqs, meta.num_tokens, meta.max_query_len)

    @property
    def cuda_graphs_captured(self) -> bool:
        return self.graph_runner is not None and self.graph_runner.captured

    def choose_linears(self) -> dict[str, object]:
        """Time cuBLAS against the Triton GEMV for the linears of up to 16 rows, once."""
        return choose_linears(self)

    def capture_cuda_graphs(self) -> dict[str, object]:
        """Capture uniform-decode graphs for the configured sizes, and ragged-batch graphs for
        ragged_graph_buckets() (after the forward's kernel warmups: the plan runs only the
        sampler's and the grammar's after it), each linear on the kernel chosen for its shape
        and row count first (runner/linear_tuning.py)."""
        if self.device.type != "cuda":
            raise RuntimeError("CUDA graphs need a CUDA device; this runner is on "
                               f"{self.device.type}")
        if self._pending is not None:
            raise RuntimeError("capture_cuda_graphs called with a step awaiting sample_tokens")
        self.choose_linears()  # the plan did, before; a worker rank has only this call
        sizes = self.config.compilation.cuda_graph_sizes or ()
        graphs = CudaGraphRunner(self._eager_forward, self.attention_backend, self.input_batch,
                                 sizes, self.decode_query_len, self.config.model.max_model_len,
                                 self.device, self.ragged_graph_buckets())
        self.graph_runner = None  # eager while capturing; a failed capture leaves none
        with torch.inference_mode():
            info = graphs.capture()
        self.graph_runner = graphs
        return info
