"""A compact Llama-style decoder: RMSNorm, RoPE, GQA attention, SwiGLU MLP.

One decoder serves every supported architecture (config.ARCHITECTURES): Llama and Mistral are
the plain layer, Qwen2 adds biases to the q/k/v projection, Qwen3 RMS-normalises each q and k
head before rotary (where the backend fuses rotary into its cache write, inside that kernel:
the layer hands it the norm weights). The attention variants differ only inside
`pre_attention` and what it hands the backend; Qwen3-MoE (Qwen3's attention) and Mixtral
(Mistral's) replace the MLP with routed experts (runner.moe), the only change to
`post_attention`.

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

from warmgate.server.config.fp8_config import FP8Config
from warmgate.server.config.runner_config import ModelConfig
from warmgate.server.runner.attention.base import (
    AttentionBackend,
    AttentionMetadata,
    RopeInput,
)
from warmgate.server.runner.fp8_linear import (
    FP8_DTYPE,
    fp8_linear,
    register_cuda_kernels,
    scale_shape,
)
from warmgate.server.runner.moe import MoEBlock, expert_shape
from warmgate.server.runner.moe_launches import MoELaunches
from warmgate.server.runner.ops import TorchOps, build_cos_sin_cache

if TYPE_CHECKING:  # only a tensor-parallel runner builds one (warmgate.server.distributed)
    from warmgate.server.runner.tensor_parallel import TensorParallel


def _param(*shape: int, device: torch.device, dtype: torch.dtype) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape, device=device, dtype=dtype), requires_grad=False)


def _projection(layer: nn.Module, name: str, rows: int, cols: int, fp8: FP8Config | None,
                device: torch.device, dtype: torch.dtype) -> None:
    """layer.<name> [rows, cols]; with FP8, float8_e4m3fn, plus <name>_scale (runner.
    fp8_linear's layout) and, with static activation scales, <name>_input_scale [1]."""
    setattr(layer, name, _param(rows, cols, device=device,
                                dtype=dtype if fp8 is None else FP8_DTYPE))
    scale = input_scale = None
    if fp8 is not None:
        scale = _param(*scale_shape(fp8, rows, cols), device=device, dtype=torch.float32)
        if fp8.static_input:
            input_scale = _param(1, device=device, dtype=torch.float32)
    setattr(layer, name + "_scale", scale)
    setattr(layer, name + "_input_scale", input_scale)


def _linear(ops: TorchOps, x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor | None,
            input_scale: torch.Tensor | None, bias: torch.Tensor | None = None) -> torch.Tensor:
    """A projection: FP8 through runner.fp8_linear, a served-dtype weight through the ops'
    linear (batch invariant under --deterministic)."""
    if scale is None:
        return ops.linear(x, weight, bias)
    return fp8_linear(x, weight, scale, input_scale, bias)


def _norm_linear(ops: TorchOps, x: torch.Tensor, residual: torch.Tensor | None,
                 norm_weight: torch.Tensor, eps: float, weight: torch.Tensor,
                 scale: torch.Tensor | None, input_scale: torch.Tensor | None,
                 bias: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm (the residual add in front) then a projection -> (out, new residual): through
    the ops' norm_linear, which may fuse them, unless the projection is FP8."""
    if scale is None:
        return ops.norm_linear(x, residual, norm_weight, eps, weight, bias)
    normed, residual = ops.rms_norm(x, norm_weight, eps, residual)
    return fp8_linear(normed, weight, scale, input_scale, bias), residual


def _per_head_rms_norm(ops: TorchOps, x: torch.Tensor, weight: torch.Tensor,
                       eps: float) -> torch.Tensor:
    """x: [T, heads, D] -> RMSNorm over D of every head, same shape."""
    num_tokens, heads, head_dim = x.shape
    normed, _ = ops.rms_norm(x.reshape(num_tokens * heads, head_dim), weight, eps)
    return normed.view(num_tokens, heads, head_dim)


class DecoderLayer(nn.Module):
    # Set by _projection: None unless the projections are FP8 (and their inputs static).
    qkv_proj_scale: nn.Parameter | None
    qkv_proj_input_scale: nn.Parameter | None
    o_proj_scale: nn.Parameter | None
    o_proj_input_scale: nn.Parameter | None
    gate_up_proj_scale: nn.Parameter | None
    gate_up_proj_input_scale: nn.Parameter | None
    down_proj_scale: nn.Parameter | None
    down_proj_input_scale: nn.Parameter | None

    def __init__(self, config: ModelConfig, layer_idx: int, ops: TorchOps,
                 device: torch.device, dtype: torch.dtype,
                 tp: TensorParallel | None = None,
                 moe_launches: MoELaunches | None = None) -> None:
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
        # The four projections may be FP8 (config.fp8): each then has its _scale (and
        # _input_scale) beside it, and runs through runner.fp8_linear.
        fp8 = config.fp8
        self.qkv_proj: nn.Parameter  # [(Hq + 2Hk) D, H]
        _projection(self, "qkv_proj", self.q_size + 2 * self.kv_size, h, fp8, device, dtype)
        self.qkv_bias = (_param(self.q_size + 2 * self.kv_size, **kw)  # [(Hq + 2Hk) D]
                         if config.qkv_bias else None)
        self.q_norm = _param(self.head_dim, **kw) if config.qk_norm else None  # [D]
        self.k_norm = _param(self.head_dim, **kw) if config.qk_norm else None  # [D]
        self.o_proj: nn.Parameter  # [H, Hq D]
        _projection(self, "o_proj", h, self.q_size, fp8, device, dtype)
        self.post_attention_layernorm = _param(h, **kw)  # [H]
        # A MoE layer's MLP is its routed experts (runner.moe); a dense one's is one SwiGLU.
        self.moe = (MoEBlock(config, device, dtype, launches=moe_launches, row_wise=ops.row_wise)
                    if config.is_moe
                    else None)
        self.gate_up_proj: nn.Parameter | None = None  # [2I, H]: gate rows, then up rows
        self.down_proj: nn.Parameter | None = None  # [H, I]
        if self.moe is None:
            _projection(self, "gate_up_proj", 2 * inter, h, fp8, device, dtype)
            _projection(self, "down_proj", h, inter, fp8, device, dtype)
        else:
            for name in ("gate_up_proj", "down_proj"):
                setattr(self, name + "_scale", None)
                setattr(self, name + "_input_scale", None)

    def forward(self, hidden: torch.Tensor, residual: torch.Tensor | None,
                positions: torch.Tensor, cos_sin_cache: torch.Tensor, kv_cache: torch.Tensor,
                backend: AttentionBackend, meta: AttentionMetadata,
                ) -> tuple[torch.Tensor, torch.Tensor]:
        # A backend that fuses rope rotates q and k inside its cache write (kernels.rope_cache)
        # and, for Qwen3, RMS-normalises their heads there first: two launches fewer a layer.
        fused = backend.fuses_rope
        q, k, v, residual = self.pre_attention(hidden, residual, positions, cos_sin_cache,
                                               rotate=not fused, norm_heads=not fused)
        rope = (RopeInput(positions, cos_sin_cache, self.q_norm, self.k_norm,
                          self.eps if self.q_norm is not None else None)
                if fused else None)
        attn = backend.forward(self.layer_idx, q, k, v, kv_cache, meta, rope)  # [T, Hq, D]
        return self.post_attention(attn.reshape(hidden.shape[0], self.q_size), residual)

    # The two dense halves are separate methods because attention reads ragged metadata and
    # stays eager: runner.compiled_forward compiles exactly these two.
    def pre_attention(self, hidden: torch.Tensor, residual: torch.Tensor | None,
                      positions: torch.Tensor, cos_sin_cache: torch.Tensor,
                      ops: TorchOps | None = None, rotate: bool = True,
                      norm_heads: bool = True,
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Norm, fused q/k/v projection (with bias), per-head q/k norm (unless not
        `norm_heads`), rotary (unless not `rotate`): the attention backend applies what is
        left out. Returns q [T, Hq, D], k and v [T, Hk, D], and the residual [T, H]. `ops`
        overrides the layer's ops (the compiled path)."""
        ops = self.ops if ops is None else ops
        num_tokens = hidden.shape[0]
        qkv, residual = _norm_linear(ops, hidden, residual, self.input_layernorm, self.eps,
                                     self.qkv_proj, self.qkv_proj_scale,
                                     self.qkv_proj_input_scale, self.qkv_bias)  # [T, (Hq + 2Hk) D]
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(num_tokens, self.num_heads, self.head_dim)
        k = k.view(num_tokens, self.num_kv_heads, self.head_dim)
        v = v.reshape(num_tokens, self.num_kv_heads, self.head_dim)
        if norm_heads and self.q_norm is not None and self.k_norm is not None:
            q = _per_head_rms_norm(ops, q, self.q_norm, self.eps)
            k = _per_head_rms_norm(ops, k, self.k_norm, self.eps)
        if rotate:
            q, k = ops.rotary(q, k, positions, cos_sin_cache)
        return q, k, v, residual

    def post_attention(self, attn: torch.Tensor, residual: torch.Tensor,
                       ops: TorchOps | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """attn: [T, Hq D] -> (hidden [T, H], residual [T, H]): output projection, norm,
        SwiGLU MLP."""
        ops = self.ops if ops is None else ops
        x = _linear(ops, attn, self.o_proj, self.o_proj_scale, self.o_proj_input_scale)
        if self.tp is not None:
            x = self.tp.all_reduce(x)
        if self.moe is not None:
            return ops.norm_moe(x, residual, self.post_attention_layernorm, self.eps, self.moe)
        assert self.gate_up_proj is not None and self.down_proj is not None
        if self.gate_up_proj_scale is None and self.down_proj_scale is None:
            # the ops may fuse the norm and the activation into the projections
            x, residual = ops.norm_mlp(x, residual, self.post_attention_layernorm, self.eps,
                                       self.gate_up_proj, self.down_proj)
        else:
            gate_up, residual = _norm_linear(ops, x, residual, self.post_attention_layernorm,
                                             self.eps, self.gate_up_proj,
                                             self.gate_up_proj_scale,
                                             self.gate_up_proj_input_scale)  # [T, 2I]
            if self.down_proj_scale is None:  # the ops may fuse the activation into it
                x = ops.silu_mul_linear(gate_up, self.down_proj)
            else:
                x = _linear(ops, ops.silu_and_mul(gate_up), self.down_proj,
                            self.down_proj_scale, self.down_proj_input_scale)
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
        register_cuda_kernels(config.fp8, device)
        vocab_rows = config.vocab_size if tp is None else tp.layout.vocab_rows
        # Attached after construction when the backend needs the KV cache's sizes first.
        self.backend = backend
        kw = dict(device=device, dtype=dtype)
        self.embed_tokens = _param(vocab_rows, config.hidden_size, **kw)  # [V, H]
        # One launch per token-count bucket for every MoE layer (they share the expert shape):
        # the warmup's moe phase fills it, the compile cache entry keeps it.
        self.moe_launches = MoELaunches(expert_shape(config)) if config.is_moe else None
        self.layers = nn.ModuleList(
            DecoderLayer(config, i, ops, device, dtype, tp, self.moe_launches)
            for i in range(config.num_layers))
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
        """hidden: [N, H] -> logits [N, V] in the model's dtype.

        Not upcast here: a float32 copy was a second pass over [N, V] (and a third, the
        argmax, read it again). A greedy step's argmax reads the logits once as they are; the
        sampler upcasts on the paths that compute with them (processors, grammar mask,
        temperature) and logprobs upcast the rows they read. A float32 copy of bf16 holds the
        same values, so no token or probability changes.
        """
        if self.config.is_pooling_model:
            raise RuntimeError("compute_logits: a pooling model has no language-model head")
        head = self.embed_tokens if self.lm_head is None else self.lm_head
        logits = self.ops.linear(hidden, head)
        return logits if self.tp is None else self.tp.gather_logits(logits)
