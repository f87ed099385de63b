"""A compact Llama-style decoder: RMSNorm, RoPE, GQA attention, SwiGLU MLP.

One decoder serves every supported architecture (config.ARCHITECTURES): Llama and Mistral are
the plain layer, Qwen2 adds biases to the q/k/v projection, Qwen3 RMS-normalises each q and k
head before rotary. The attention variants differ only inside `pre_attention`; Qwen3-MoE
(Qwen3's attention) and Mixtral (Mistral's) replace the MLP with routed experts
(runner.moe), the only change to `post_attention`.

Projections are fused the way serving kernels want them (q/k/v in one matmul, gate/up in
another); `weights.py` splits and fuses to and from Hugging Face tensor names. Attention is
delegated to the backend, which owns the paged KV cache layout. Parameters are allocated with
`torch.empty` on the target device and filled by `weights.py`: no default init runs, which
matters for an 8B shape.

Tensor parallel (`tp`, None at TP=1, where nothing below changes): each rank holds its heads'
rows of q/k/v, its block of gate/up rows (column-parallel) and the matching columns of o and
down (row-parallel, each ending in one all-reduce), and a block of the vocabulary.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from warmgate.server.config.runner_config import ModelConfig
from warmgate.server.runner.attention.base import AttentionBackend, AttentionMetadata
from warmgate.server.runner.moe import MoEBlock
from warmgate.server.runner.ops import TorchOps, build_cos_sin_cache

if TYPE_CHECKING:  # only a tensor-parallel runner builds one (warmgate.server.distributed)
    from warmgate.server.runner.tensor_parallel import TensorParallel


def _param(*shape: int, device: torch.device, dtype: torch.dtype) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape, device=device, dtype=dtype), requires_grad=False)


def _per_head_rms_norm(ops: TorchOps, x: torch.Tensor, weight: torch.Tensor,
                       eps: float) -> torch.Tensor:
    """x: [T, heads, D] -> RMSNorm over D of every head, same shape."""
    num_tokens, heads, head_dim = x.shape
    normed, _ = ops.rms_norm(x.reshape(num_tokens * heads, head_dim), weight, eps)
    return normed.view(num_tokens, heads, head_dim)


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer_idx: int, ops: TorchOps,
                 device: torch.device, dtype: torch.dtype,
                 tp: TensorParallel | None = None) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.ops = ops
        self.tp = tp
        self.eps = config.rms_norm_eps
        shard = tp.layout if tp is not None else config  # this rank's heads and MLP rows
        self.num_heads = shard.num_heads
        self.num_kv_heads = shard.num_kv_heads
        self.head_dim = config.head_dim
        self.q_size = self.num_heads * config.head_dim
        self.kv_size = self.num_kv_heads * config.head_dim
        h, inter = config.hidden_size, shard.intermediate_size
        kw = dict(device=device, dtype=dtype)
        self.input_layernorm = _param(h, **kw)  # [H]
        self.qkv_proj = _param(self.q_size + 2 * self.kv_size, h, **kw)  # [(Hq + 2Hk) D, H]
        self.qkv_bias = (_param(self.q_size + 2 * self.kv_size, **kw)  # [(Hq + 2Hk) D]
                         if config.qkv_bias else None)
        self.q_norm = _param(self.head_dim, **kw) if config.qk_norm else None  # [D]
        self.k_norm = _param(self.head_dim, **kw) if config.qk_norm else None  # [D]
        self.o_proj = _param(h, self.q_size, **kw)  # [H, Hq D]
        self.post_attention_layernorm = _param(h, **kw)  # [H]
        # A MoE layer's MLP is its routed experts (runner.moe); a dense one's is one SwiGLU.
        self.moe = (MoEBlock(config, device, dtype, row_wise=ops.row_wise) if config.is_moe
                    else None)
        self.gate_up_proj: nn.Parameter | None = None  # [2I, H]: gate rows, then up rows
        self.down_proj: nn.Parameter | None = None  # [H, I]
        if self.moe is None:
            self.gate_up_proj = _param(2 * inter, h, **kw)
            self.down_proj = _param(h, inter, **kw)

    def forward(self, hidden: torch.Tensor, residual: torch.Tensor | None,
                positions: torch.Tensor, cos_sin_cache: torch.Tensor, kv_cache: torch.Tensor,
                backend: AttentionBackend, meta: AttentionMetadata,
                ) -> tuple[torch.Tensor, torch.Tensor]:
        q, k, v, residual = self.pre_attention(hidden, residual, positions, cos_sin_cache)
        attn = backend.forward(self.layer_idx, q, k, v, kv_cache, meta)  # [T, Hq, D]
        return self.post_attention(attn.reshape(hidden.shape[0], self.q_size), residual)

    # The two dense halves are separate methods because attention reads ragged metadata and
    # stays eager: runner.compiled_forward compiles exactly these two.
    def pre_attention(self, hidden: torch.Tensor, residual: torch.Tensor | None,
                      positions: torch.Tensor, cos_sin_cache: torch.Tensor,
                      ops: TorchOps | None = None,
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Norm, fused q/k/v projection (with bias), per-head q/k norm, rotary. Returns
        q [T, Hq, D], k and v [T, Hk, D], and the residual [T, H]. `ops` overrides the
        layer's ops (the compiled path)."""
        ops = self.ops if ops is None else ops
        num_tokens = hidden.shape[0]
        x, residual = ops.rms_norm(hidden, self.input_layernorm, self.eps, residual)
        qkv = ops.linear(x, self.qkv_proj, self.qkv_bias)  # [T, (Hq + 2Hk) D]
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(num_tokens, self.num_heads, self.head_dim)
        k = k.view(num_tokens, self.num_kv_heads, self.head_dim)
        v = v.reshape(num_tokens, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q = _per_head_rms_norm(ops, q, self.q_norm, self.eps)
            k = _per_head_rms_norm(ops, k, self.k_norm, self.eps)
        q, k = ops.rotary(q, k, positions, cos_sin_cache)
        return q, k, v, residual

    def post_attention(self, attn: torch.Tensor, residual: torch.Tensor,
                       ops: TorchOps | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """attn: [T, Hq D] -> (hidden [T, H], residual [T, H]): output projection, norm,
        SwiGLU MLP."""
        ops = self.ops if ops is None else ops
        x = ops.linear(attn, self.o_proj)
        if self.tp is not None:
            x = self.tp.all_reduce(x)
        x, residual = ops.rms_norm(x, self.post_attention_layernorm, self.eps, residual)
        if self.moe is not None:
            return self.moe(x), residual
        assert self.gate_up_proj is not None and self.down_proj is not None
        x = ops.silu_and_mul(ops.linear(x, self.gate_up_proj))  # [T, I]
        x = ops.linear(x, self.down_proj)
        if self.tp is not None:
            x = self.tp.all_reduce(x)
        return x, residual


class LlamaModel(nn.Module):
    def __init__(self, config: ModelConfig, ops: TorchOps, backend: AttentionBackend | None,
                 device: torch.device, dtype: torch.dtype,
                 tp: TensorParallel | None = None) -> None:
        super().__init__()
        self.config = config
        self.ops = ops
        self.tp = tp
        vocab_rows = config.vocab_size if tp is None else tp.layout.vocab_rows
        # Attached after construction when the backend needs the KV cache's sizes first.
        self.backend = backend
        kw = dict(device=device, dtype=dtype)
        self.embed_tokens = _param(vocab_rows, config.hidden_size, **kw)  # [V, H]
        self.layers = nn.ModuleList(
            DecoderLayer(config, i, ops, device, dtype, tp) for i in range(config.num_layers))
        self.norm = _param(config.hidden_size, **kw)  # [H]
        # A pooling model never projects to the vocabulary; a tied head reads embed_tokens.
        self.lm_head: nn.Parameter | None = None
        if not config.is_pooling_model and not config.tie_word_embeddings:
            self.lm_head = _param(vocab_rows, config.hidden_size, **kw)  # [V, H]
        self.register_buffer(  # [max_model_len, D] float32
            "cos_sin_cache",
            build_cos_sin_cache(config.max_model_len, config.head_dim, config.rope, device),
            persistent=False)

    @property
    def device(self) -> torch.device:
        return self.embed_tokens.device

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_tokens.dtype

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                kv_caches: list[torch.Tensor], meta: AttentionMetadata) -> torch.Tensor:
        """input_ids, positions: [T] int64 -> hidden states [T, H] after the final norm."""
        if self.backend is None:
            raise RuntimeError("LlamaModel.forward: no attention backend attached")
        hidden = (F.embedding(input_ids, self.embed_tokens) if self.tp is None
                  else self.tp.embed(input_ids, self.embed_tokens))  # [T, H]
        residual: torch.Tensor | None = None
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            hidden, residual = layer(hidden, residual, positions, self.cos_sin_cache, kv_cache,
                                     self.backend, meta)
        hidden, _ = self.ops.rms_norm(hidden, self.norm, self.config.rms_norm_eps, residual)
        return hidden

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: [N, H] -> float32 logits [N, V]."""
        if self.config.is_pooling_model:
            raise RuntimeError("compute_logits: a pooling model has no language-model head")
        head = self.embed_tokens if self.lm_head is None else self.lm_head
        logits = self.ops.linear(hidden, head).float()
        return logits if self.tp is None else self.tp.gather_logits(logits)
