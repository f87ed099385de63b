"""CUDA graphs for uniform-decode batches and, where the attention backend allows, for ragged
ones (prefill, chunked prefill, mixed prefill+decode).

Uniform decode. The recipe: capture sizes in requests (so in tokens every size is a multiple
of decode_query_len); capture largest first into one memory pool; one eager run of the same
batch before each capture; fall back to eager when no captured size fits. A step's inputs are
staged for the shape it replays (runner/step_staging.py): padded to the nearest captured size
on the host, where padded requests read and write only the null block 0, and sent with the
step's one copy to the device views that shape's graph was captured on. Every graph is
replayed once right after capture, so its upload is part of warmup, not of the first real
batch.

Capture does not go through torch.cuda.graph: its __enter__ empties the caching allocator
(and the pinned host cache) before every capture, handing back every block the warmup's eager
phases had cached, so the first eager step after ready - any prefill, the sampler of every
step - had to cudaMalloc its memory again, and ran slower than its steady median
(bench/results/h200-segments.txt). The graphs' own pool is separate either way.

Ragged batches, one graph per token bucket (runner.compile_buckets: the decode sizes, powers
of two, max_num_batched_tokens). An eager prefill is host-bound: Python spends longer
launching its kernels than the GPU spends running them, and that host time, varying from step
to step and process to process, was what a first request's time to first token varied by
(bench/results/h200-step-profile.txt). A bucket's graph holds min(max_num_reqs, bucket)
requests: every real request has at least one token, so no batch of that many tokens has more.
At replay the batch's tokens fill the first rows, the rest of the bucket's tokens belong to no
request (attention leaves their rows alone; every other op is row-wise, so whatever they hold
never reaches a real row) and write to the null block, and the unused requests get query
length 0 (the varlen kernel's programs for them exit at once). The launch shapes are the
bucket's: grids sized for bucket-long queries over all of the graph's requests. Backends whose
forward reads host metadata (the torch reference's loops, FlashInfer's plan) say so with
supports_ragged_graphs = False and keep ragged batches eager.
"""

from __future__ import annotations

import bisect
import contextlib
import gc
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from warmgate.server.runner.attention.base import AttentionBackend, AttentionMetadata
from warmgate.server.runner.step_shape import RAGGED, UNIFORM, StepShape
from warmgate.server.runner.step_staging import StepViews

logger = logging.getLogger(__name__)

ForwardFn = Callable[[torch.Tensor, torch.Tensor, AttentionMetadata], torch.Tensor]


def capturable_sizes(sizes: Sequence[int], max_reqs: int, decode_query_len: int,
                     max_tokens: int) -> list[int]:
    """The uniform-decode capture sizes (requests) that fit the batch buffers, ascending."""
    return sorted({s for s in sizes if s <= max_reqs and s * decode_query_len <= max_tokens})


# Where a capture's time goes: the eager run before each graph, recording it, capture_end
# (which instantiates the graph), and the first replay of every graph (its upload).
CAPTURE_STEPS = ("eager_runs_s", "recording_s", "instantiation_s", "first_replays_s")


def _free_bytes(device: torch.device) -> int:
    free, _ = torch.cuda.mem_get_info(device)
    return int(free)


@contextlib.contextmanager
def capturing(graph: torch.cuda.CUDAGraph, pool: Any, stream: torch.cuda.Stream,
              error_mode: str = "global") -> Iterator[None]:
    """Record the work issued inside into `graph` (memory from `pool`), on a side stream as
    capture requires; what torch.cuda.graph does, minus emptying the allocator caches.

    The garbage collector stays off while recording: a collection that frees an unreachable
    CUDA graph or stream (an earlier runner's, a replaced capture's) calls an API a capture
    forbids, and the capture in progress is invalidated. CudaGraphRunner.capture collects
    once before its first graph, as torch.cuda.graph does before each. error_mode
    "thread_local" lets other threads go on with calls a capture forbids (the GEMM sweep's,
    warmup/gemm_background.py, beside the MoE autotune's graphs); "global" forbids them in
    every thread, for a capture that must have the process to itself.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        with torch.cuda.stream(stream):
            graph.capture_begin(pool=pool, capture_error_mode=error_mode)
            try:
                yield
            finally:
                graph.capture_end()
    finally:
        if was_enabled:
            gc.enable()


class CudaGraphRunner:
    def __init__(self, forward: ForwardFn, backend: AttentionBackend, buffers: Any,
                 sizes: Sequence[int], decode_query_len: int, max_model_len: int,
                 device: torch.device, ragged_buckets: Sequence[int] = ()) -> None:
        self.forward = forward
        self.backend = backend
        self.buffers = buffers  # the InputBatch whose staged views the graphs read
        self.decode_query_len = decode_query_len
        self.max_model_len = max_model_len
        self.device = device
        max_reqs, max_tokens = buffers.max_num_reqs, buffers.max_num_tokens
        self.sizes = capturable_sizes(sizes, max_reqs, decode_query_len, max_tokens)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        # Ragged batches: token bucket -> graph, output [bucket, H].
        self.max_reqs = max_reqs
        self.ragged_buckets = sorted({b for b in ragged_buckets if 1 <= b <= max_tokens})
        self.ragged_graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.ragged_outputs: dict[int, torch.Tensor] = {}
        self.num_ragged_replays = 0
        # Seconds of the last capture by step (CAPTURE_STEPS), for its report.
        self._spent = dict.fromkeys(CAPTURE_STEPS, 0.0)
        self.num_replays = 0
        # Per shape, the metadata its graph replays with (views are a function of the shape).
        self._metas: dict[StepShape, AttentionMetadata] = {}

    @property
    def captured(self) -> bool:
        return bool(self.graphs)

    def size_for(self, num_reqs: int) -> int | None:
        sizes = sorted(self.graphs)
        i = bisect.bisect_left(sizes, num_reqs)
        return sizes[i] if i < len(sizes) else None

    def shape_for(self, num_reqs: int, num_tokens: int, uniform: bool) -> StepShape | None:
        """The captured graph a step of num_reqs requests and num_tokens tokens replays (a
        uniform decode the smallest size that holds its requests, a ragged batch the
        smallest token bucket that holds its tokens); None: it runs eagerly."""
        if uniform:
            size = self.size_for(num_reqs)
            return None if size is None else self.uniform_shape(size)
        i = bisect.bisect_left(self.ragged_buckets, num_tokens)
        if i == len(self.ragged_buckets) or self.ragged_buckets[i] not in self.ragged_graphs:
            return None  # too many tokens, or not captured (yet)
        return self.ragged_shape(self.ragged_buckets[i])

    def uniform_shape(self, size: int) -> StepShape:
        return StepShape(UNIFORM, size * self.decode_query_len, size)

    def ragged_shape(self, bucket: int) -> StepShape:
        """A bucket's graph holds min(max_reqs, bucket) requests."""
        return StepShape(RAGGED, bucket, self.ragged_reqs(bucket))

    def ragged_reqs(self, bucket: int) -> int:
        """Requests a ragged graph of `bucket` tokens holds."""
        return min(self.max_reqs, bucket)

    def graph_meta(self, shape: StepShape, views: StepViews) -> AttentionMetadata:
        """The metadata a shape's graph is captured and replayed with: its whole views."""
        uniform = shape.kind == UNIFORM
        return AttentionMetadata(
            num_reqs=shape.num_reqs, num_tokens=shape.num_tokens,
            max_query_len=self.decode_query_len if uniform else shape.num_tokens,
            max_seq_len=self.max_model_len, query_start_loc=views.query_start_loc.gpu,
            seq_lens=views.seq_lens.gpu, block_table=views.block_table.gpu,
            slot_mapping=views.slot_mapping.gpu, positions=views.positions.gpu,
            query_start_loc_cpu=views.query_start_loc.cpu, seq_lens_cpu=views.seq_lens.cpu,
            block_table_cpu=views.block_table.cpu, is_uniform_decode=uniform,
            for_cuda_graph=True)

    def _capture_one(self, shape: StepShape, pool: Any, stream: torch.cuda.Stream
                     ) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        start = time.perf_counter()
        views = self.buffers.stage_empty(shape)
        meta = self.graph_meta(shape, views)
        self.backend.plan(meta)
        # One eager run first: lazy allocations and autotuning must not happen in capture.
        self.forward(views.input_ids.gpu, views.positions.gpu, meta)
        torch.cuda.synchronize(self.device)
        eager = time.perf_counter()
        graph = torch.cuda.CUDAGraph()
        with capturing(graph, pool, stream):
            out = self.forward(views.input_ids.gpu, views.positions.gpu, meta)
            recorded = time.perf_counter()
        self._spent["eager_runs_s"] += eager - start
        self._spent["recording_s"] += recorded - eager
        self._spent["instantiation_s"] += time.perf_counter() - recorded  # capture_end's
        return graph, out

    def capture(self) -> dict[str, object]:
        """Capture every graph, largest token count first, into one pool. Returns sizes,
        buckets, seconds, memory."""
        torch.cuda.synchronize(self.device)
        free_before = _free_bytes(self.device)
        start = time.perf_counter()
        self.graphs.clear()
        self.outputs.clear()
        self.ragged_graphs.clear()
        self.ragged_outputs.clear()
        self._spent = dict.fromkeys(CAPTURE_STEPS, 0.0)
        gc.collect()  # destroy unreachable graphs and streams now, not inside a capture
        pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream(self.device)
        # (tokens, is_ragged, size): the biggest graphs first, so smaller ones reuse the pool.
        todo = sorted([(s * self.decode_query_len, False, s) for s in self.sizes]
                      + [(t, True, t) for t in self.ragged_buckets], reverse=True)
        for _, ragged, size in todo:
            if ragged:
                graph, out = self._capture_one(self.ragged_shape(size), pool, stream)
                self.ragged_graphs[size], self.ragged_outputs[size] = graph, out
            else:
                self.backend.begin_graph_capture(size)
                graph, out = self._capture_one(self.uniform_shape(size), pool, stream)
                self.graphs[size], self.outputs[size] = graph, out
        self.backend.end_graph_capture()
        replays = time.perf_counter()
        # Replay each graph once now: the first launch of an instantiated graph also uploads
        # it to the device, which would otherwise land on the first real batch of that size.
        for shape in [*map(self.uniform_shape, sorted(self.graphs)),
                      *map(self.ragged_shape, sorted(self.ragged_graphs))]:
            self._launch(shape, self.buffers.stage_empty(shape))
        torch.cuda.synchronize(self.device)
        self._spent["first_replays_s"] = time.perf_counter() - replays
        seconds = time.perf_counter() - start
        free_after = _free_bytes(self.device)
        info: dict[str, object] = {
            "sizes": sorted(self.graphs), "tokens_per_request": self.decode_query_len,
            "ragged_buckets": sorted(self.ragged_graphs),
            "free_mib_before": free_before // 2**20, "free_mib_after": free_after // 2**20,
            "graph_pool_mib": max(0, free_before - free_after) // 2**20,
            "seconds": round(seconds, 4),
            **{step: round(spent, 4) for step, spent in self._spent.items()}}
        logger.info("captured %d uniform-decode CUDA graphs (sizes %s, %d tokens each request) "
                    "and %d ragged-batch graphs (token buckets %s) in %.2f s (%s); free memory "
                    "%d MiB -> %d MiB", len(self.graphs), info["sizes"], self.decode_query_len,
                    len(self.ragged_graphs), info["ragged_buckets"], seconds,
                    ", ".join(f"{step[:-2].replace('_', ' ')} {spent:.2f} s"
                              for step, spent in self._spent.items()),
                    info["free_mib_before"], info["free_mib_after"])
        return info

    def replay(self, shape: StepShape, views: StepViews) -> torch.Tensor:
        """Replay shape's graph on the views its step was staged in; its whole output
        [shape.num_tokens, H] (the step's own rows first)."""
        if shape.kind == UNIFORM:
            self.num_replays += 1
        else:
            self.num_ragged_replays += 1
        return self._launch(shape, views)

    def _launch(self, shape: StepShape, views: StepViews) -> torch.Tensor:
        meta = self._metas.get(shape)
        if meta is None:
            meta = self._metas[shape] = self.graph_meta(shape, views)
        self.backend.plan(meta)
        if shape.kind == UNIFORM:
            self.graphs[shape.num_reqs].replay()
            return self.outputs[shape.num_reqs]
        self.ragged_graphs[shape.num_tokens].replay()
        return self.ragged_outputs[shape.num_tokens]
