"""CUDA graphs for uniform-decode batches and, where the attention backend allows, for ragged
ones (prefill, chunked prefill, mixed prefill+decode).

Uniform decode. The recipe: static max-size input buffers (the InputBatch's device buffers);
capture sizes in requests (so in tokens every size is a multiple of decode_query_len); capture
largest first into one memory pool; one eager run of the same batch before each capture; at
replay pad the batch to the nearest captured size and reset the padding; fall back to eager
when no captured size fits. Padded requests read and write only the null block 0. Every graph
is replayed once right after capture, so its upload is part of warmup, not of the first real
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
        self.buffers = buffers  # the InputBatch whose StaticBuffers the graphs read
        self.decode_query_len = decode_query_len
        self.max_model_len = max_model_len
        self.device = device
        max_reqs = buffers.seq_lens.gpu.shape[0]
        max_tokens = buffers.input_ids.gpu.shape[0]
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
        # For a uniform decode, query_start_loc is always 0, q, 2q, ...
        self._uniform_qsl = (torch.arange(max_reqs + 1, dtype=torch.int32)
                             * decode_query_len)  # [max_reqs + 1], host
        self._uniform_qsl_gpu = self._uniform_qsl.to(device)

    @property
    def captured(self) -> bool:
        return bool(self.graphs)

    def size_for(self, num_reqs: int) -> int | None:
        sizes = sorted(self.graphs)
        i = bisect.bisect_left(sizes, num_reqs)
        return sizes[i] if i < len(sizes) else None

    def _graph_meta(self, num_reqs: int, num_tokens: int, max_query_len: int,
                    uniform: bool) -> AttentionMetadata:
        """Graph metadata: views of the first num_reqs / num_tokens rows of the buffers."""
        b = self.buffers
        return AttentionMetadata(
            num_reqs=num_reqs, num_tokens=num_tokens, max_query_len=max_query_len,
            max_seq_len=self.max_model_len, query_start_loc=b.query_start_loc.gpu[:num_reqs + 1],
            seq_lens=b.seq_lens.gpu[:num_reqs], block_table=b.block_table.gpu[:num_reqs],
            slot_mapping=b.slot_mapping.gpu[:num_tokens], positions=b.positions.gpu[:num_tokens],
            query_start_loc_cpu=b.query_start_loc.cpu[:num_reqs + 1],
            seq_lens_cpu=b.seq_lens.cpu[:num_reqs], block_table_cpu=b.block_table.cpu[:num_reqs],
            is_uniform_decode=uniform, for_cuda_graph=True)

    def _pad(self, num_reqs: int, size: int) -> AttentionMetadata:
        """Fill rows num_reqs..size of every buffer with a harmless request on the null block,
        and return graph metadata over the first `size` rows."""
        b, q = self.buffers, self.decode_query_len
        self.buffers.zero_tokens(num_reqs * q, size * q)
        b.block_table.gpu[num_reqs:size].zero_()
        b.seq_lens.gpu[num_reqs:size].fill_(q)
        b.query_start_loc.gpu[:size + 1].copy_(self._uniform_qsl_gpu[:size + 1])
        # Host copies for planners: rows past num_reqs were not part of this step's copies.
        b.seq_lens.cpu[num_reqs:size] = q
        b.block_table.cpu[num_reqs:size] = 0
        b.query_start_loc.cpu[:size + 1] = self._uniform_qsl[:size + 1]
        return self._graph_meta(size, size * q, q, uniform=True)

    def ragged_reqs(self, bucket: int) -> int:
        """Requests a ragged graph of `bucket` tokens holds."""
        return min(self.max_reqs, bucket)

    def _pad_ragged(self, num_reqs: int, num_tokens: int, bucket: int) -> AttentionMetadata:
        """Graph metadata over `bucket` tokens: the batch's requests and tokens first, then
        requests of query length 0 and tokens that no request owns, written to the null
        block."""
        b, r_pad = self.buffers, self.ragged_reqs(bucket)
        self.buffers.zero_tokens(num_tokens, bucket)
        b.query_start_loc.gpu[num_reqs + 1:r_pad + 1].fill_(num_tokens)
        b.seq_lens.gpu[num_reqs:r_pad].zero_()
        b.block_table.gpu[num_reqs:r_pad].zero_()  # stale rows would name live blocks
        b.query_start_loc.cpu[num_reqs + 1:r_pad + 1] = num_tokens
        b.seq_lens.cpu[num_reqs:r_pad] = 0
        b.block_table.cpu[num_reqs:r_pad] = 0
        return self._graph_meta(r_pad, bucket, bucket, uniform=False)

    def _capture_one(self, tokens: int, meta: AttentionMetadata, pool: Any,
                     stream: torch.cuda.Stream) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        b = self.buffers
        start = time.perf_counter()
        self.backend.plan(meta)
        # One eager run first: lazy allocations and autotuning must not happen in capture.
        self.forward(b.input_ids.gpu[:tokens], b.positions.gpu[:tokens], meta)
        torch.cuda.synchronize(self.device)
        eager = time.perf_counter()
        graph = torch.cuda.CUDAGraph()
        with capturing(graph, pool, stream):
            out = self.forward(b.input_ids.gpu[:tokens], b.positions.gpu[:tokens], meta)
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
        self.buffers.query_start_loc.gpu[:1].zero_()
        # (tokens, is_ragged, size): the biggest graphs first, so smaller ones reuse the pool.
        todo = sorted([(s * self.decode_query_len, False, s) for s in self.sizes]
                      + [(t, True, t) for t in self.ragged_buckets], reverse=True)
        for tokens, ragged, size in todo:
            if ragged:
                graph, out = self._capture_one(tokens, self._pad_ragged(0, 0, size), pool,
                                               stream)
                self.ragged_graphs[size], self.ragged_outputs[size] = graph, out
            else:
                self.backend.begin_graph_capture(size)
                graph, out = self._capture_one(tokens, self._pad(0, size), pool, stream)
                self.graphs[size], self.outputs[size] = graph, out
        self.backend.end_graph_capture()
        replays = time.perf_counter()
        # Replay each graph once now: the first launch of an instantiated graph also uploads
        # it to the device, which would otherwise land on the first real batch of that size.
        for size in sorted(self.graphs):
            self.backend.plan(self._pad(0, size))
            self.graphs[size].replay()
        for bucket in sorted(self.ragged_graphs):
            self.backend.plan(self._pad_ragged(0, 0, bucket))
            self.ragged_graphs[bucket].replay()
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

    def run(self, meta: AttentionMetadata) -> torch.Tensor | None:
        """Replay the graph for this uniform-decode batch; None means run it eagerly."""
        size = self.size_for(meta.num_reqs)
        if size is None:
            return None  # the runner records the miss, with the batch, in its JitMonitor
        graph_meta = self._pad(meta.num_reqs, size)
        self.backend.plan(graph_meta)
        self.graphs[size].replay()
        self.num_replays += 1
        return self.outputs[size][:meta.num_tokens]

    def run_ragged(self, meta: AttentionMetadata) -> torch.Tensor | None:
        """Replay the smallest ragged graph that holds this batch's tokens; None: eager."""
        i = bisect.bisect_left(self.ragged_buckets, meta.num_tokens)
        if i == len(self.ragged_buckets) or self.ragged_buckets[i] not in self.ragged_graphs:
            return None  # too many tokens, or not captured (yet)
        bucket = self.ragged_buckets[i]
        graph_meta = self._pad_ragged(meta.num_reqs, meta.num_tokens, bucket)
        self.backend.plan(graph_meta)
        self.ragged_graphs[bucket].replay()
        self.num_ragged_replays += 1
        return self.ragged_outputs[bucket][:meta.num_tokens]
