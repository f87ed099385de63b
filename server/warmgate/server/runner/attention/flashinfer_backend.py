"""FlashInfer attention: paged prefill and decode wrappers, planned once per batch.

Only imported when the `flashinfer` backend is chosen, so the CPU path never imports it.
The per-layer KV cache [2, num_blocks, block_size, num_kv_heads, head_dim] splits into the
(k_cache, v_cache) pair of NHD tensors FlashInfer takes.

A uniform decode with one query token per request runs the decode wrapper; everything else,
speculative decodes (1 + k query tokens) included, runs the causal prefill wrapper. Graph
capture gets a wrapper per captured batch size with its own persistent index buffers, so a
replay only needs a fresh `plan` on the host.

Ragged batches (prefill, chunked prefill, mixed) replay a CUDA graph per token bucket, like the
triton backend's, and attend there with our Triton varlen kernel. FlashInfer's prefill wrapper
cannot be captured for them: its plan is host work per batch, and its graph mode fixes the
number of requests. Eagerly, a prefill pays a Python launch per kernel (about fifteen a layer):
on llama-3.2-1b a 300-token prefill took 13-18 ms that way against triton's 6 ms in a graph.
With ragged graphs off (--no-ragged-cuda-graphs) ragged batches run FlashInfer's prefill
eagerly.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

import torch

from warmgate.server.kernels.rope_cache import rope_and_cache
from warmgate.server.kernels.varlen_attention import paged_attention_varlen
from warmgate.server.runner.attention.base import (
    AttentionBackend,
    AttentionMetadata,
    AttentionSpec,
    RopeInput,
)
from warmgate.server.runner.attention.concurrency import run_concurrently

logger = logging.getLogger(__name__)

WORKSPACE_BYTES = 256 * 1024 * 1024
# "0" builds the decode and prefill JIT modules one after the other instead of at once.
PARALLEL_JIT_ENV = "WARMGATE_FLASHINFER_PARALLEL_JIT"
# plan()'s choice for a ragged batch inside a CUDA graph: the varlen kernel, no wrapper.
_RAGGED_GRAPH = "ragged graph"


def tensor_core_decode(num_heads: int, num_kv_heads: int) -> bool:
    """Whether decode runs FlashInfer's tensor-core kernel (a JIT module of its own): it pays
    off once several query heads share a KV head."""
    return num_heads // num_kv_heads >= 4


@dataclass
class PagedLayout:
    """FlashInfer's CSR page table for one batch (host tensors, indices on the device)."""

    qo_indptr: torch.Tensor  # [num_reqs + 1] int32, host
    kv_indptr: torch.Tensor  # [num_reqs + 1] int32, host
    kv_indices: torch.Tensor  # [total_pages] int32, device
    kv_last_page_len: torch.Tensor  # [num_reqs] int32, host


def paged_layout(meta: AttentionMetadata, block_size: int, device: torch.device) -> PagedLayout:
    seq_lens = meta.seq_lens_cpu[:meta.num_reqs].to(torch.int64)
    # Padded graph rows may have seq_len 0: give them one page (the null block) of one token
    # so the kernels see a well-formed, if meaningless, request.
    num_pages = torch.clamp((seq_lens + block_size - 1) // block_size, min=1)
    table = meta.block_table_cpu
    if table is None:
        table = meta.block_table.cpu()  # a host sync, only when the runner gave no host copy
    table = table[:meta.num_reqs]
    mask = torch.arange(table.shape[1])[None, :] < num_pages[:, None]
    kv_indptr = torch.zeros(meta.num_reqs + 1, dtype=torch.int32)
    kv_indptr[1:] = torch.cumsum(num_pages, 0)
    last = torch.clamp(seq_lens - (num_pages - 1) * block_size, min=1).to(torch.int32)
    return PagedLayout(qo_indptr=meta.query_start_loc_cpu[:meta.num_reqs + 1].to(torch.int32),
                       kv_indptr=kv_indptr, kv_indices=table[mask].to(torch.int32).to(device),
                       kv_last_page_len=last)


class FlashInferAttentionBackend(AttentionBackend):
    name = "flashinfer"
    supports_ragged_graphs = True
    fuses_rope = True

    def __init__(self, spec: AttentionSpec) -> None:
        super().__init__(spec)
        if spec.device.type != "cuda":
            raise RuntimeError("the flashinfer attention backend needs a CUDA device; use "
                               "--attention-backend torch on CPU")
        import flashinfer

        self._fi = flashinfer
        self.workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=spec.device)
        self.use_tensor_cores = tensor_core_decode(spec.num_heads, spec.num_kv_heads)
        self.prefill = flashinfer.BatchPrefillWithPagedKVCacheWrapper(self.workspace, "NHD")
        self.decode = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            self.workspace, "NHD", use_tensor_cores=self.use_tensor_cores)
        self._graph_wrappers: dict[int, Any] = {}
        self._active: Any = None

    # -- planning -----------------------------------------------------------------------
    def _uses_decode_kernel(self, meta: AttentionMetadata) -> bool:
        return meta.is_uniform_decode and meta.max_query_len == 1

    def _plan_decode(self, wrapper: Any, layout: PagedLayout) -> None:
        s = self.spec
        wrapper.plan(layout.kv_indptr, layout.kv_indices, layout.kv_last_page_len, s.num_heads,
                     s.num_kv_heads, s.head_dim, s.block_size, q_data_type=s.dtype,
                     kv_data_type=s.dtype, sm_scale=s.scale)

    def _plan_prefill(self, wrapper: Any, layout: PagedLayout) -> None:
        s = self.spec
        wrapper.plan(layout.qo_indptr, layout.kv_indptr, layout.kv_indices,
                     layout.kv_last_page_len, s.num_heads, s.num_kv_heads, s.head_dim,
                     s.block_size, causal=True, q_data_type=s.dtype, kv_data_type=s.dtype,
                     sm_scale=s.scale)

    def plan(self, meta: AttentionMetadata) -> None:
        if meta.for_cuda_graph and not meta.is_uniform_decode:
            self._active = _RAGGED_GRAPH  # the varlen kernel reads device metadata only
            return
        layout = paged_layout(meta, self.spec.block_size, self.spec.device)
        if meta.for_cuda_graph:
            wrapper = self._graph_wrappers.get(meta.num_reqs)
            if wrapper is None:
                raise RuntimeError(f"no FlashInfer graph wrapper for {meta.num_reqs} requests; "
                                   "begin_graph_capture was not called for that size")
        else:
            wrapper = self.decode if self._uses_decode_kernel(meta) else self.prefill
        if self._uses_decode_kernel(meta):
            self._plan_decode(wrapper, layout)
        else:
            self._plan_prefill(wrapper, layout)
        self._active = wrapper

    def forward(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                kv_cache: torch.Tensor, meta: AttentionMetadata,
                rope: RopeInput | None = None) -> torch.Tensor:
        k_cache, v_cache = kv_cache[0], kv_cache[1]  # NHD [num_blocks, block_size, Hk, D]
        if rope is None:
            flat = (-1, self.spec.num_kv_heads, self.spec.head_dim)
            k_cache.view(flat).index_copy_(0, meta.slot_mapping, k.to(k_cache.dtype))
            v_cache.view(flat).index_copy_(0, meta.slot_mapping, v.to(v_cache.dtype))
        else:
            # One Triton kernel rotates q (into a dense tensor: run() wants it contiguous) and
            # k and writes k and v into the NHD cache, where the index_copy pair plus the
            # model's rotary kernel were three launches and two extra passes (and Qwen3's
            # per-head q/k norms two more).
            q = rope_and_cache(q, k, v, rope.positions, rope.cos_sin_cache, k_cache, v_cache,
                               meta.slot_mapping, layout="NHD",
                               q_norm_weight=rope.q_norm_weight,
                               k_norm_weight=rope.k_norm_weight, eps=rope.norm_eps)
        if self._active is None:
            raise RuntimeError("FlashInfer backend used before plan(); the runner must plan "
                               "each batch")
        if self._active is _RAGGED_GRAPH:
            return paged_attention_varlen(
                q, kv_cache, meta.block_table, meta.seq_lens, meta.query_start_loc,
                scale=self.spec.scale, max_query_len=meta.max_query_len,
                num_reqs=meta.num_reqs)
        return self._active.run(q.contiguous(), (k_cache, v_cache))

    # -- CUDA graphs ----------------------------------------------------------------------
    def begin_graph_capture(self, num_reqs: int) -> None:
        """A wrapper with persistent buffers for this batch size; plan() picks it in graphs."""
        if num_reqs in self._graph_wrappers:
            return
        s, dev, fi = self.spec, self.spec.device, self._fi
        indptr = torch.zeros(num_reqs + 1, dtype=torch.int32, device=dev)
        indices = torch.zeros(num_reqs * s.max_blocks_per_req, dtype=torch.int32, device=dev)
        last = torch.zeros(num_reqs, dtype=torch.int32, device=dev)
        if s.decode_query_len == 1:
            wrapper = fi.BatchDecodeWithPagedKVCacheWrapper(
                self.workspace, "NHD", use_cuda_graph=True,
                use_tensor_cores=self.use_tensor_cores, paged_kv_indptr_buffer=indptr,
                paged_kv_indices_buffer=indices, paged_kv_last_page_len_buffer=last)
        else:
            qo = torch.zeros(num_reqs + 1, dtype=torch.int32, device=dev)
            wrapper = fi.BatchPrefillWithPagedKVCacheWrapper(
                self.workspace, "NHD", use_cuda_graph=True, qo_indptr_buf=qo,
                paged_kv_indptr_buf=indptr, paged_kv_indices_buf=indices,
                paged_kv_last_page_len_buf=last)
        self._graph_wrappers[num_reqs] = wrapper

    # -- JIT warmup -----------------------------------------------------------------------
    def _warm_decode(self, kv: tuple[torch.Tensor, torch.Tensor], workspace: torch.Tensor
                     ) -> None:
        s = self.spec
        indptr = torch.tensor([0, 1], dtype=torch.int32)
        indices = torch.tensor([1], dtype=torch.int32, device=s.device)
        last = torch.tensor([s.block_size], dtype=torch.int32)
        decode = self._fi.BatchDecodeWithPagedKVCacheWrapper(
            workspace, "NHD", use_tensor_cores=self.use_tensor_cores)
        self._plan_decode(decode, PagedLayout(indptr, indptr, indices, last))
        decode.run(torch.randn(1, s.num_heads, s.head_dim, dtype=s.dtype, device=s.device), kv)
        torch.cuda.synchronize(s.device)

    def _warm_prefill(self, kv: tuple[torch.Tensor, torch.Tensor], workspace: torch.Tensor
                      ) -> None:
        s = self.spec
        q_len = 2
        indptr = torch.tensor([0, 1], dtype=torch.int32)
        indices = torch.tensor([1], dtype=torch.int32, device=s.device)
        last = torch.tensor([s.block_size], dtype=torch.int32)
        qo = torch.tensor([0, q_len], dtype=torch.int32)
        prefill = self._fi.BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD")
        self._plan_prefill(prefill, PagedLayout(qo, indptr, indices, last))
        prefill.run(torch.randn(q_len, s.num_heads, s.head_dim, dtype=s.dtype,
                                device=s.device), kv)
        torch.cuda.synchronize(s.device)

    def jit_warmup(self, *, parallel: bool | None = None) -> dict[str, object]:
        """Plan and run one decode and one causal prefill on a scratch cache: FlashInfer
        JIT-compiles (or loads from its cache) the modules for these head shapes and dtype.

        By default the two modules build on two threads at once (their nvcc subprocesses
        overlap); `parallel=False` or WARMGATE_FLASHINFER_PARALLEL_JIT=0 builds them one
        after the other. The two wrappers get separate float workspaces: a plan writes its
        schedule into the workspace, and two plans in flight must not share one.
        """
        s = self.spec
        if parallel is None:
            parallel = os.environ.get(PARALLEL_JIT_ENV, "1").strip().lower() not in \
                ("0", "false", "no", "off")
        cache = torch.randn(2, 2, s.block_size, s.num_kv_heads, s.head_dim, dtype=s.dtype,
                            device=s.device)
        kv = (cache[0], cache[1])
        scratch = (torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=s.device)
                   if parallel else self.workspace)
        dev = s.device

        def on_device(fn: Any, ws: torch.Tensor) -> Any:
            def call() -> None:
                with torch.cuda.device(dev):  # a new thread starts on cuda:0
                    fn(kv, ws)
            return call

        t = run_concurrently({"decode": on_device(self._warm_decode, self.workspace),
                              "prefill": on_device(self._warm_prefill, scratch)},
                             parallel=parallel)
        logger.info("flashinfer JIT warmup: decode %.2f s, prefill %.2f s, wall %.2f s (%s; "
                    "tensor-core decode=%s)", t.seconds["decode"], t.seconds["prefill"],
                    t.wall_s, "parallel" if parallel else "sequential", self.use_tensor_cores)
        return {"num_steps": 2, "use_tensor_cores": self.use_tensor_cores,
                "parallel": parallel, "decode_s": round(t.seconds["decode"], 4),
                "prefill_s": round(t.seconds["prefill"], 4),
                "longest_module_s": round(t.longest_s, 4), "wall_s": round(t.wall_s, 4)}
