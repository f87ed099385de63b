"""The attention backend interface and the per-batch metadata every backend reads."""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import ClassVar

import torch


@dataclass(frozen=True)
class AttentionSpec:
    num_heads: int
    num_kv_heads: int
    head_dim: int
    block_size: int
    num_blocks: int
    # Blocks a request can hold at most: the block table's width.
    max_blocks_per_req: int
    max_num_reqs: int
    max_num_tokens: int
    dtype: torch.dtype
    device: torch.device
    # 1 + num_speculative_steps: the query length of every request in a uniform decode.
    decode_query_len: int = 1
    # --deterministic: every query row reduces over its keys in one fixed order, whatever
    # the batch and however its request's tokens were split into steps.
    deterministic: bool = False

    @property
    def scale(self) -> float:
        return self.head_dim ** -0.5


@dataclass
class AttentionMetadata:
    """One step's batch layout. Tensors live on the runner's device.

    Tokens are laid out request after request; request i owns tokens
    query_start_loc[i]:query_start_loc[i+1], at positions seq_lens[i]-query_len_i .. seq_lens[i]-1.
    On the CUDA-graph path these tensors are views of the step's staged buffer
    (runner/step_staging.py) padded to the captured size: padded requests have query length 0
    (or the decode length with blocks pointing at the null block) and padded tokens write to
    slot 0 of the null block.
    """

    num_reqs: int
    num_tokens: int
    max_query_len: int
    max_seq_len: int
    query_start_loc: torch.Tensor  # [num_reqs + 1] int32
    seq_lens: torch.Tensor  # [num_reqs] int32, tokens in the KV cache after this step
    block_table: torch.Tensor  # [num_reqs, max_blocks_per_req] int32, 0-padded (null block)
    slot_mapping: torch.Tensor  # [num_tokens] int64, block_id * block_size + offset
    positions: torch.Tensor  # [num_tokens] int64
    # Host copies, for backends that plan on the CPU (FlashInfer) and for the torch reference.
    query_start_loc_cpu: torch.Tensor  # [num_reqs + 1] int32
    seq_lens_cpu: torch.Tensor  # [num_reqs] int32
    is_uniform_decode: bool
    # [num_reqs, max_blocks_per_req] int32 host copy of block_table, for backends that plan
    # on the CPU (FlashInfer); None when the runner does not provide one.
    block_table_cpu: torch.Tensor | None = None
    # True while a CUDA graph is being captured or replayed: no host syncs, no allocations
    # that depend on values.
    for_cuda_graph: bool = False


@dataclass(frozen=True)
class RopeInput:
    """What a backend that applies the rotary embedding itself needs (fuses_rope).

    With a per-head q/k norm (Qwen3) the weights and eps ride along and the backend
    normalises every q and k head before it rotates them; the model then skips its own.
    """

    positions: torch.Tensor  # [num_tokens] int64
    cos_sin_cache: torch.Tensor  # [max_pos, head_dim] float32, cos then sin
    q_norm_weight: torch.Tensor | None = None  # [head_dim]
    k_norm_weight: torch.Tensor | None = None  # [head_dim]
    norm_eps: float | None = None


class AttentionBackend(abc.ABC):
    """One instance per runner; it serves every layer.

    The KV cache of a layer is a tensor [2, num_blocks, block_size, num_kv_heads, head_dim]:
    index 0 holds keys, 1 values (FlashInfer's NHD layout when split in two).
    """

    name: ClassVar[str]
    # Whether forward reads only device metadata, with launch shapes from the metadata's
    # host ints: then a ragged batch (prefill, mixed) can replay a graph captured for its token
    # bucket (runner.cuda_graphs). Host loops over requests or a host-side plan cannot.
    supports_ragged_graphs: ClassVar[bool] = False
    # Whether forward takes q and k unrotated with a RopeInput and rotates them while writing
    # the cache (one kernel instead of rotary + cache write). The model asks before it rotates.
    fuses_rope: ClassVar[bool] = False

    def __init__(self, spec: AttentionSpec) -> None:
        self.spec = spec

    def plan(self, meta: AttentionMetadata) -> None:  # noqa: B027 - optional hook
        """Per-batch preparation shared by every layer (FlashInfer's plan). Default: nothing."""

    @abc.abstractmethod
    def forward(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                kv_cache: torch.Tensor, meta: AttentionMetadata,
                rope: RopeInput | None = None) -> torch.Tensor:
        """Write k, v into kv_cache at meta.slot_mapping, then attend causally over the cache.

        q: [num_tokens, num_heads, head_dim]; k, v: [num_tokens, num_kv_heads, head_dim].
        With `rope` (only ever passed when fuses_rope), q and k are unrotated and the backend
        rotates both by rope.positions first, after normalising their heads when rope carries
        norm weights. Returns [num_tokens, num_heads, head_dim].
        """

    def jit_warmup(self) -> dict[str, object] | None:
        """Compile this backend's own JIT modules up front (the warmup's `flashinfer` phase).

        Returns what was compiled (names, shapes) or None when the backend has nothing to JIT.
        """
        return None

    # CUDA-graph hooks: backends that keep per-batch device state (FlashInfer's wrappers)
    # override these so captured graphs read buffers that stay alive between replays.
    def begin_graph_capture(self, num_reqs: int) -> None:  # noqa: B027
        """Called before capturing a uniform-decode graph for num_reqs requests."""

    def end_graph_capture(self) -> None:  # noqa: B027
        """Called after every graph has been captured."""
