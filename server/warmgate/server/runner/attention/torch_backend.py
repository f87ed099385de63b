"""Paged attention in plain torch: the CPU path and the reference the other backends match.

Two formulations. Uniform decode batches use a padded batched one that reads only device
tensors and host ints fixed by the batch shape, so it never syncs and can be captured in a
CUDA graph. Everything else (prefill, mixed, ragged) loops over requests using the metadata's
host copies, which is simple and exact for any query and sequence length.
Scores and softmax are float32 whatever the cache dtype.

On CUDA a request of that loop attends in one fused kernel (torch's scaled_dot_product_attention
in float32, its causal mask aligned to the sequence's end). Written as two einsums it ran two
cuBLAS GEMMs whose shapes follow the prompt's length, and a GEMM shape's first call pays for
cuBLAS's kernel choice and loading (milliseconds each): every prompt length that had not come
before was slow once, which no warmup can cover for every length. The fused kernel is one for
all lengths. The CPU keeps the einsum form (no such first call there, and its tests pin its
roundings), and so does --deterministic, whose per-token pieces the batch-invariance tests pin.
"""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

from warmgate.server.config.runner_config import cdiv
from warmgate.server.runner.attention.base import (
    AttentionBackend,
    AttentionMetadata,
    AttentionSpec,
    RopeInput,
)

# A finite fill keeps a row with no visible key (a padded request) finite instead of NaN.
_MASKED = torch.finfo(torch.float32).min


class TorchAttentionBackend(AttentionBackend):
    name: ClassVar[str] = "torch"

    def __init__(self, spec: AttentionSpec) -> None:
        super().__init__(spec)
        # Where a request of the ragged loop attends in one fused kernel (module docstring).
        self.fused_requests = spec.device.type == "cuda" and not spec.deterministic

    def forward(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                kv_cache: torch.Tensor, meta: AttentionMetadata,
                rope: RopeInput | None = None) -> torch.Tensor:
        if rope is not None:  # fuses_rope is False: the model rotates q and k itself
            raise ValueError("the torch attention backend does not apply the rotary embedding")
        self._write_kv(k, v, kv_cache, meta.slot_mapping)
        if meta.is_uniform_decode and not self.spec.deterministic:
            return self._uniform_decode(q, kv_cache, meta)
        return self._varlen(q, kv_cache, meta)

    def _write_kv(self, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor,
                  slot_mapping: torch.Tensor) -> None:
        num_kv_heads, head_dim = self.spec.num_kv_heads, self.spec.head_dim
        num_tokens = slot_mapping.shape[0]
        # [num_blocks * block_size, Hk, D] views: a slot id indexes them directly.
        kv_cache[0].view(-1, num_kv_heads, head_dim).index_copy_(
            0, slot_mapping, k[:num_tokens].to(kv_cache.dtype))
        kv_cache[1].view(-1, num_kv_heads, head_dim).index_copy_(
            0, slot_mapping, v[:num_tokens].to(kv_cache.dtype))

    def _uniform_decode(self, q: torch.Tensor, kv_cache: torch.Tensor,
                        meta: AttentionMetadata) -> torch.Tensor:
        spec = self.spec
        num_reqs, q_len = meta.num_reqs, meta.max_query_len
        group = spec.num_heads // spec.num_kv_heads
        # Under a graph the width must not depend on this batch's lengths; eagerly, reading
        # only the blocks the longest sequence uses keeps memory proportional to the batch.
        width_blocks = (spec.max_blocks_per_req if meta.for_cuda_graph
                        else min(cdiv(meta.max_seq_len, spec.block_size),
                                 spec.max_blocks_per_req))
        table = meta.block_table[:num_reqs, :width_blocks]  # [R, Wb]
        width = width_blocks * spec.block_size
        keys = kv_cache[0][table].reshape(num_reqs, width, spec.num_kv_heads, spec.head_dim)
        values = kv_cache[1][table].reshape(num_reqs, width, spec.num_kv_heads, spec.head_dim)
        qr = q[:num_reqs * q_len].reshape(num_reqs, q_len, spec.num_kv_heads, group,
                                          spec.head_dim).float()
        scores = torch.einsum("rqhgd,rkhd->rhgqk", qr, keys.float()) * spec.scale
        offsets = torch.arange(q_len, device=q.device)
        q_pos = meta.seq_lens[:num_reqs, None].long() - q_len + offsets  # [R, L]
        k_pos = torch.arange(width, device=q.device)  # [W]
        visible = k_pos[None, None, :] <= q_pos[:, :, None]  # [R, L, W]
        scores = scores.masked_fill(~visible[:, None, None], _MASKED)
        probs = torch.softmax(scores, dim=-1)
        out = torch.einsum("rhgqk,rkhd->rqhgd", probs, values.float())
        out = out.reshape(num_reqs * q_len, spec.num_heads, spec.head_dim).to(q.dtype)
        if out.shape[0] == q.shape[0]:
            return out
        # Tokens past the batch (graph padding) get zeros rather than stale values.
        full = q.new_zeros(q.shape)
        full[:out.shape[0]] = out
        return full

    def _varlen(self, q: torch.Tensor, kv_cache: torch.Tensor,
                meta: AttentionMetadata) -> torch.Tensor:
        spec = self.spec
        starts = meta.query_start_loc_cpu.tolist()
        seq_lens = meta.seq_lens_cpu.tolist()
        out = q.new_zeros(q.shape)
        attend = self._attend_fused if self.fused_requests else self._attend
        for i in range(meta.num_reqs):
            start, end, seq_len = starts[i], starts[i + 1], seq_lens[i]
            n = end - start
            # --deterministic: each query token alone over exactly its own keys, so its
            # GEMM and softmax shapes depend on its position only (runner.deterministic_ops).
            pieces = ([(start + j, start + j + 1, seq_len - n + j + 1) for j in range(n)]
                      if spec.deterministic else [(start, end, seq_len)] if n else [])
            for piece in pieces:
                attend(q, out, kv_cache, meta.block_table[i], *piece)
        return out

    def _request_kv(self, kv_cache: torch.Tensor, table_row: torch.Tensor, seq_len: int
                    ) -> tuple[torch.Tensor, torch.Tensor]:
        """A request's first seq_len keys and values, [seq_len, Hk, D] each, from its blocks."""
        spec = self.spec
        blocks = table_row[:cdiv(seq_len, spec.block_size)]
        keys = kv_cache[0][blocks].reshape(-1, spec.num_kv_heads, spec.head_dim)[:seq_len]
        values = kv_cache[1][blocks].reshape(-1, spec.num_kv_heads, spec.head_dim)[:seq_len]
        return keys, values

    def _attend_fused(self, q: torch.Tensor, out: torch.Tensor, kv_cache: torch.Tensor,
                      table_row: torch.Tensor, start: int, end: int, seq_len: int) -> None:
        """_attend's result in one fused attention kernel, float32 as there."""
        spec = self.spec
        group = spec.num_heads // spec.num_kv_heads
        keys, values = self._request_kv(kv_cache, table_row, seq_len)

        def heads(x: torch.Tensor) -> torch.Tensor:
            # [S, Hk, D] -> [1, Hq, S, D] float32, each kv head once per query head of its
            # group (query head h reads kv head h // group, as _attend's reshape does).
            rows = x.shape[0]
            x = x[:, :, None].expand(rows, spec.num_kv_heads, group, spec.head_dim).float()
            return x.reshape(rows, spec.num_heads, spec.head_dim).transpose(0, 1)[None]

        qh = q[start:end].float().transpose(0, 1)[None]  # [1, Hq, n, D]
        # The n queries are the sequence's last n tokens: query j sees keys 0..seq_len-n+j.
        o = F.scaled_dot_product_attention(qh, heads(keys), heads(values),
                                           attn_mask=causal_lower_right(end - start, seq_len),
                                           scale=spec.scale)
        out[start:end] = o[0].transpose(0, 1).to(q.dtype)

    def _attend(self, q: torch.Tensor, out: torch.Tensor, kv_cache: torch.Tensor,
                table_row: torch.Tensor, start: int, end: int, seq_len: int) -> None:
        """Query tokens start:end, the last ones of a sequence of seq_len, into out."""
        spec = self.spec
        group = spec.num_heads // spec.num_kv_heads
        n = end - start
        keys, values = self._request_kv(kv_cache, table_row, seq_len)
        qi = q[start:end].reshape(n, spec.num_kv_heads, group, spec.head_dim).float()
        scores = torch.einsum("qhgd,khd->hgqk", qi, keys.float()) * spec.scale
        q_pos = torch.arange(seq_len - n, seq_len, device=q.device)  # [n]
        k_pos = torch.arange(seq_len, device=q.device)  # [seq_len]
        visible = k_pos[None, :] <= q_pos[:, None]  # [n, seq_len]
        scores = scores.masked_fill(~visible, _MASKED)
        # As rows of a 2-D tensor: torch's CPU softmax over the last dim of a 4-D one takes a
        # slow path (3 ms for 200 elements).
        probs = torch.softmax(scores.reshape(-1, seq_len), dim=-1).view(scores.shape)
        oi = torch.einsum("hgqk,khd->qhgd", probs, values.float())
        out[start:end] = oi.reshape(n, spec.num_heads, spec.head_dim).to(q.dtype)
