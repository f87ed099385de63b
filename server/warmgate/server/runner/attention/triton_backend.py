"""The `triton` attention backend: our own paged-attention kernels.

forward = the cache write (with the rotary embedding, and Qwen3's per-head q/k norm, fused
in: kernels.rope_cache), then the decode kernel for uniform decode batches (the CUDA-graph
path: no host syncs, launch shapes from Python ints fixed per captured graph) or the varlen
kernel for everything else. A uniform decode's decode kernel rotates q and k and writes the
cache itself (kernels/_decode_rope.py; a power-of-two head_dim), so its layers launch no
rope-and-cache kernel. Under --deterministic every batch runs the fixed-split kernel
instead (kernels.fixed_split_attention).
"""

from __future__ import annotations

import logging

import torch

from warmgate.server.kernels._decode_rope import DecodeRope, rotates_in_decode
from warmgate.server.kernels.decode_attention import (
    choose_num_splits,
    merge_counts_for,
    paged_attention_decode,
)
from warmgate.server.kernels.fixed_split_attention import (
    key_tile,
    paged_attention_fixed_split,
    query_programs,
    split_bytes,
)
from warmgate.server.kernels.fixed_split_plan import fixed_split_plan
from warmgate.server.kernels.kv_cache import reshape_and_cache
from warmgate.server.kernels.matmul_plan import device_sm_count
from warmgate.server.kernels.rope_cache import rope_and_cache
from warmgate.server.kernels.varlen_attention import paged_attention_varlen
from warmgate.server.runner.attention.base import (
    AttentionBackend,
    AttentionMetadata,
    AttentionSpec,
    RopeInput,
)

logger = logging.getLogger(__name__)


class TritonAttentionBackend(AttentionBackend):
    name = "triton"
    supports_ragged_graphs = True
    fuses_rope = True

    def __init__(self, spec: AttentionSpec) -> None:
        super().__init__(spec)
        device = torch.device(spec.device)
        # Split-K targets the SM count; off the GPU (the interpreter) one split is plenty.
        self._num_sms = (torch.cuda.get_device_properties(device).multi_processor_count
                         if device.type == "cuda" else 1)
        self._max_context_len = spec.max_blocks_per_req * spec.block_size
        self._splits: dict[int, int] = {}
        # The decode kernel's split programs count themselves in here, and the last merges:
        # no merge kernel (kernels.decode_attention).
        self._merge_counts = merge_counts_for(spec.max_num_reqs, spec.num_kv_heads, device)
        self._split_plan = fixed_split_plan(self._max_context_len, key_tile(
            spec.head_dim, spec.dtype, device.type == "cuda"))
        self._invariant_sms = device_sm_count(device)
        if spec.deterministic:
            logger.info("deterministic attention: keys cut every %d positions (%d splits over "
                        "the %d-key capacity); small batches run them apart (%d SMs)",
                        self._split_plan.split_keys, self._split_plan.max_splits,
                        self._max_context_len, self._invariant_sms)

    def num_splits(self, num_reqs: int) -> int:
        """Decode split-K factor: a function of num_reqs and the spec only, so one captured
        graph always replays the split it was captured with."""
        if num_reqs not in self._splits:
            splits = choose_num_splits(num_reqs, self.spec.num_kv_heads,
                                       self._max_context_len, self._num_sms)
            self._splits[num_reqs] = splits
            logger.debug("triton decode: %d requests -> %d splits (%d SMs, context %d)",
                         num_reqs, splits, self._num_sms, self._max_context_len)
        return self._splits[num_reqs]

    def split_programs(self, num_reqs: int, num_tokens: int) -> int:
        """--deterministic: programs per (query block, KV head), from the launch's
        host ints only (fixed per captured graph). More than one runs the splits apart with a
        merge; the bits are the same either way. The interpreter plans as for an H100
        (device_sm_count), so the CPU tests take the GPU's decisions."""
        spec = self.spec
        unsplit = spec.num_kv_heads * query_programs(
            num_tokens, num_reqs, spec.num_heads // spec.num_kv_heads, spec.head_dim,
            spec.dtype, spec.device.type == "cuda")
        return self._split_plan.programs(unsplit, self._invariant_sms,
                                         split_bytes(num_tokens, spec.num_heads, spec.head_dim))

    def forward(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                kv_cache: torch.Tensor, meta: AttentionMetadata,
                rope: RopeInput | None = None) -> torch.Tensor:
        """q: [T, Hq, D]; k, v: [T, Hk, D]; kv_cache: [2, num_blocks, block_size, Hk, D]."""
        decode = meta.is_uniform_decode and not self.spec.deterministic
        if decode and rope is not None and rotates_in_decode(self.spec.head_dim):
            # The decode kernel rotates q and k and writes the cache itself: no rope-and-cache
            # launch a layer (kernels/_decode_rope.py).
            return self._decode(q, kv_cache, meta, DecodeRope(
                k, v, rope.positions, rope.cos_sin_cache, meta.slot_mapping,
                rope.q_norm_weight, rope.k_norm_weight, rope.norm_eps))
        if rope is None:
            reshape_and_cache(k, v, kv_cache, meta.slot_mapping)
        else:
            q = rope_and_cache(q, k, v, rope.positions, rope.cos_sin_cache, kv_cache[0],
                               kv_cache[1], meta.slot_mapping, q_norm_weight=rope.q_norm_weight,
                               k_norm_weight=rope.k_norm_weight, eps=rope.norm_eps)
        # --deterministic: the fixed-split kernel for every batch. Its key splits sit at fixed
        # absolute positions and are folded in one order, with the same tiles for every query
        # length, so a token's attention is the same bits in a prefill chunk, a decode or a
        # verification, alone or batched (the decode kernel's splits follow seq_len).
        if self.spec.deterministic:
            programs = self.split_programs(meta.num_reqs, q.shape[0])
            return paged_attention_fixed_split(
                q, kv_cache, meta.block_table, meta.seq_lens, meta.query_start_loc,
                scale=self.spec.scale, max_query_len=meta.max_query_len,
                split_keys=self._split_plan.split_keys, split_programs=programs,
                num_reqs=meta.num_reqs)
        if decode:
            return self._decode(q, kv_cache, meta, None)
        return paged_attention_varlen(
            q, kv_cache, meta.block_table, meta.seq_lens, meta.query_start_loc,
            scale=self.spec.scale, max_query_len=meta.max_query_len, num_reqs=meta.num_reqs)

    def _decode(self, q: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata,
                rope: DecodeRope | None) -> torch.Tensor:
        """The uniform decode kernel, its splits fixed by the batch's request count."""
        return paged_attention_decode(
            q, kv_cache, meta.block_table, meta.seq_lens, meta.query_start_loc,
            scale=self.spec.scale, query_len=meta.max_query_len,
            num_splits=self.num_splits(meta.num_reqs), num_reqs=meta.num_reqs,
            merge_counts=self._merge_counts, rope=rope)
