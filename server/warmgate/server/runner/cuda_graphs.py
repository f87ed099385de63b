"""CUDA graphs for uniform-decode batches.

The recipe: static max-size input buffers (the InputBatch's device buffers); capture sizes in
requests (so in tokens every size is a multiple of decode_query_len); capture largest first
into one memory pool; one eager run of the same batch before each capture; at replay pad the
batch to the nearest captured size and reset the padding; fall back to eager when no captured
size fits. Padded requests read and write only the null block 0. Every graph is replayed
once right after capture, so its upload is part of warmup, not of the first real decode.

Capture does not go through torch.cuda.graph: its __enter__ empties the caching allocator
(and the pinned host cache) before every capture, handing back every block the warmup's eager
phases had cached, so the first eager step after ready - any prefill, the sampler of every
step - had to cudaMalloc its memory again (on the H200, bench/first_probe.py
--trace-segments: 3 new segments for the first prefill and 6 for the first k=3 decode, which
ran 1.5 and 1.4 ms over their steady medians). The graphs' own pool is separate either way.
"""

from __future__ import annotations

import bisect
import contextlib
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from warmgate.server.runner.attention.base import AttentionBackend, AttentionMetadata

logger = logging.getLogger(__name__)

ForwardFn = Callable[[torch.Tensor, torch.Tensor, AttentionMetadata], torch.Tensor]


def _free_bytes(device: torch.device) -> int:
    free, _ = torch.cuda.mem_get_info(device)
    return int(free)


@contextlib.contextmanager
def capturing(graph: torch.cuda.CUDAGraph, pool: Any, stream: torch.cuda.Stream
              ) -> Iterator[None]:
    """Record the work issued inside into `graph` (memory from `pool`), on a side stream as
    capture requires; what torch.cuda.graph does, minus emptying the allocator caches."""
    with torch.cuda.stream(stream):
        graph.capture_begin(pool=pool)
        try:
            yield
        finally:
            graph.capture_end()


class CudaGraphRunner:
    def __init__(self, forward: ForwardFn, backend: AttentionBackend, buffers: Any,
                 sizes: Sequence[int], decode_query_len: int, max_model_len: int,
                 device: torch.device) -> None:
        self.forward = forward
        self.backend = backend
        self.buffers = buffers  # the InputBatch whose StaticBuffers the graphs read
        self.decode_query_len = decode_query_len
        self.max_model_len = max_model_len
        self.device = device
        max_reqs = buffers.seq_lens.gpu.shape[0]
        max_tokens = buffers.input_ids.gpu.shape[0]
        self.sizes = sorted({s for s in sizes if s <= max_reqs
                             and s * decode_query_len <= max_tokens})
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        # Uniform-decode batches that found no captured size and ran eagerly.
        self.num_misses = 0
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

    def _pad(self, num_reqs: int, size: int) -> AttentionMetadata:
        """Fill rows num_reqs..size of every buffer with a harmless request on the null block,
        and return graph metadata over the first `size` rows."""
        b, q = self.buffers, self.decode_query_len
        t_real, t_pad = num_reqs * q, size * q
        b.input_ids.gpu[t_real:t_pad].zero_()
        b.positions.gpu[t_real:t_pad].zero_()
        b.slot_mapping.gpu[t_real:t_pad].zero_()  # slot 0 of the null block
        b.block_table.gpu[num_reqs:size].zero_()
        b.seq_lens.gpu[num_reqs:size].fill_(q)
        b.query_start_loc.gpu[:size + 1].copy_(self._uniform_qsl_gpu[:size + 1])
        # Host copies for planners: rows past num_reqs were not part of this step's copies.
        b.seq_lens.cpu[num_reqs:size] = q
        b.block_table.cpu[num_reqs:size] = 0
        b.query_start_loc.cpu[:size + 1] = self._uniform_qsl[:size + 1]
        return AttentionMetadata(
            num_reqs=size, num_tokens=t_pad, max_query_len=q, max_seq_len=self.max_model_len,
            query_start_loc=b.query_start_loc.gpu[:size + 1], seq_lens=b.seq_lens.gpu[:size],
            block_table=b.block_table.gpu[:size], slot_mapping=b.slot_mapping.gpu[:t_pad],
            positions=b.positions.gpu[:t_pad], query_start_loc_cpu=b.query_start_loc.cpu[:size + 1],
            seq_lens_cpu=b.seq_lens.cpu[:size], block_table_cpu=b.block_table.cpu[:size],
            is_uniform_decode=True, for_cuda_graph=True)

    def capture(self) -> dict[str, object]:
        """Capture every size, largest first, into one pool. Returns sizes, seconds, memory."""
        torch.cuda.synchronize(self.device)
        free_before = _free_bytes(self.device)
        start = time.perf_counter()
        self.graphs.clear()
        self.outputs.clear()
        pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream(self.device)
        b = self.buffers
        for size in sorted(self.sizes, reverse=True):
            self.backend.begin_graph_capture(size)
            meta = self._pad(0, size)
            t = size * self.decode_query_len
            self.backend.plan(meta)
            # One eager run first: lazy allocations and autotuning must not happen in capture.
            self.forward(b.input_ids.gpu[:t], b.positions.gpu[:t], meta)
            torch.cuda.synchronize(self.device)
            graph = torch.cuda.CUDAGraph()
            with capturing(graph, pool, stream):
                self.outputs[size] = self.forward(b.input_ids.gpu[:t], b.positions.gpu[:t], meta)
            self.graphs[size] = graph
        self.backend.end_graph_capture()
        # Replay each graph once now: the first launch of an instantiated graph also uploads
        # it to the device, which would otherwise land on the first real decode of that size.
        for size in sorted(self.graphs):
            self.backend.plan(self._pad(0, size))
            self.graphs[size].replay()
        torch.cuda.synchronize(self.device)
        seconds = time.perf_counter() - start
        free_after = _free_bytes(self.device)
        info: dict[str, object] = {
            "sizes": sorted(self.graphs), "tokens_per_request": self.decode_query_len,
            "free_mib_before": free_before // 2**20, "free_mib_after": free_after // 2**20,
            "graph_pool_mib": max(0, free_before - free_after) // 2**20,
            "seconds": round(seconds, 4)}
        logger.info("captured %d uniform-decode CUDA graphs (sizes %s, %d tokens each request) "
                    "in %.2f s; free memory %d MiB -> %d MiB", len(self.graphs),
                    info["sizes"], self.decode_query_len, seconds, info["free_mib_before"],
                    info["free_mib_after"])
        return info

    def run(self, meta: AttentionMetadata) -> torch.Tensor | None:
        """Replay the graph for this uniform-decode batch; None means run it eagerly."""
        size = self.size_for(meta.num_reqs)
        if size is None:
            if self.graphs:
                self.num_misses += 1
            return None
        graph_meta = self._pad(meta.num_reqs, size)
        self.backend.plan(graph_meta)
        self.graphs[size].replay()
        self.num_replays += 1
        return self.outputs[size][:meta.num_tokens]
