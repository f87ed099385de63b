"""The model's forward with the dense half-layers under torch.compile, one graph per bucket.

`DecoderLayer.pre_attention` (norm, q/k/v projection, rotary) and `post_attention` (output
projection, norm, MLP) are compiled with dynamic=False; attention, whose metadata is ragged,
runs eagerly between them on the real tokens only. The token dimension is padded up to a
bucket (runner.compile_buckets), so the graphs ever seen are exactly one per bucket and
function, shared by every layer (weights reach the graph as inputs, not constants). The
padded rows are computed and thrown away: every dense op is row-wise, so they never touch a
real token.

Both functions are compiled from fresh copies of their code objects: dynamo keeps compiled
graphs on the code object, so two runners in one process (tests; a benchmark comparing
warmup on and off) would otherwise share graphs and the second would never compile.
"""

from __future__ import annotations

import logging
import types
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from warmgate.server.runner.attention.base import AttentionMetadata
from warmgate.server.runner.compile_buckets import bucket_for
from warmgate.server.runner.model import DecoderLayer, LlamaModel
from warmgate.server.runner.ops import TorchOps

logger = logging.getLogger(__name__)

# Inductor writes its own fused kernels (C++ on the CPU, Triton on CUDA) from plain torch ops;
# our Triton launch wrappers inside a compiled region would only get in its way.
_COMPILED_OPS = TorchOps()


def _fresh_copy(fn: Callable[..., Any]) -> Callable[..., Any]:
    copy = types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__,
                              fn.__defaults__, fn.__closure__)
    copy.__kwdefaults__ = fn.__kwdefaults__
    copy.__qualname__ = fn.__qualname__
    return copy


def _allow_recompiles(num_buckets: int) -> None:
    """Dynamo stops compiling a function after `recompile_limit` shapes (8 by default) and
    runs it eagerly from then on; one graph per bucket needs at least that many. Raised,
    never lowered, process-wide: the limit is read at compile time, anywhere in a call."""
    import torch._dynamo

    config = torch._dynamo.config
    name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
    # Head-room: past the limit dynamo runs the function eagerly without a word to the JIT
    # observers, so an unexpected recompile must stay well inside it to be counted.
    wanted = 4 * num_buckets
    if getattr(config, name) < wanted:
        setattr(config, name, wanted)


def _inductor_options(device: torch.device) -> dict[str, Any]:
    """Single-threaded C++ kernels on the CPU: OpenMP kernel threads spin against aten's
    threads and other processes' for the same few cores, which made a compiled step far slower
    than eager; with one kernel thread it runs close to eager. The matmuls (aten calls from
    the graph) still use aten's threads."""
    return {"cpp.threads": 1} if device.type == "cpu" else {}


def _padded(x: torch.Tensor, rows: int) -> torch.Tensor:
    """A new dense tensor of `rows` rows holding x then zeros - a copy even when no row is
    added. The compiled graphs guard on strides and on dispatch keys: a view of a runner
    buffer (allocated outside inference mode) and a tensor made inside it differ, so the
    unpadded batch of a bucket would otherwise compile a second graph for it."""
    out = x.new_zeros((rows, *x.shape[1:]))
    out[:x.shape[0]] = x
    return out


class CompiledForward:
    def __init__(self, model: LlamaModel, buckets: Sequence[int]) -> None:
        if not buckets:
            raise ValueError("CompiledForward needs at least one token bucket")
        self.model = model
        self.buckets = tuple(sorted(buckets))
        _allow_recompiles(len(self.buckets))
        options = _inductor_options(model.device)
        self._pre = torch.compile(_fresh_copy(DecoderLayer.pre_attention), dynamic=False,
                                  options=options)
        self._post = torch.compile(_fresh_copy(DecoderLayer.post_attention), dynamic=False,
                                   options=options)

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor,
                 kv_caches: list[torch.Tensor], meta: AttentionMetadata) -> torch.Tensor:
        """input_ids, positions: [T] int64 -> hidden states [T, H] after the final norm."""
        model, backend = self.model, self.model.backend
        if backend is None:
            raise RuntimeError("CompiledForward: no attention backend attached")
        n = input_ids.shape[0]
        padded = bucket_for(self.buckets, n)
        # Padding is token 0 at position 0: valid indices, and their rows are dropped below.
        input_ids, positions = _padded(input_ids, padded), _padded(positions, padded)
        hidden = F.embedding(input_ids, model.embed_tokens)  # [B, H]
        # A zero residual instead of None keeps one graph for layer 0 and the rest.
        residual = torch.zeros_like(hidden)
        for layer, kv_cache in zip(model.layers, kv_caches, strict=True):
            q, k, v, residual = self._pre(layer, hidden, residual, positions,
                                          model.cos_sin_cache, _COMPILED_OPS)
            attn = backend.forward(layer.layer_idx, q[:n], k[:n], v[:n], kv_cache, meta)
            attn = _padded(attn.reshape(n, layer.q_size), padded)  # [B, Hq D]
            hidden, residual = self._post(layer, attn, residual, _COMPILED_OPS)
        hidden, _ = model.ops.rms_norm(hidden[:n], model.norm, model.config.rms_norm_eps,
                                       residual[:n])
        return hidden
