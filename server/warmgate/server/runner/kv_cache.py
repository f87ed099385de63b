"""The paged KV cache: one tensor per layer, plus vLLM-shaped config objects describing it.

Warmup code written against vLLM reads `kv_cache_config.num_blocks` and
`kv_cache_config.kv_cache_groups[i].kv_cache_spec.block_size`; these dataclasses keep those
names so it ports over unchanged.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch

from warmgate.server.host_memory import host_available_bytes

logger = logging.getLogger(__name__)

LOWER_SETTINGS = ("Lower cache.num_blocks (--num-blocks), or max_model_len or max_num_seqs "
                  "(which size the automatic block count)")
# Block 0 backs padded tokens and padded block-table entries; it is never handed to a request.
NULL_BLOCK_ID = 0


@dataclass(frozen=True)
class FullAttentionSpec:
    block_size: int
    num_kv_heads: int = 0
    head_size: int = 0
    dtype: torch.dtype = torch.float32

    @property
    def page_size_bytes(self) -> int:
        """Bytes of one block of one layer, keys and values together."""
        elem = torch.empty((), dtype=self.dtype).element_size()
        return 2 * self.block_size * self.num_kv_heads * self.head_size * elem


@dataclass(frozen=True)
class KVCacheGroupSpec:
    kv_cache_spec: FullAttentionSpec
    layer_names: tuple[str, ...] = ()


@dataclass(frozen=True)
class KVCacheConfig:
    num_blocks: int
    kv_cache_groups: list[KVCacheGroupSpec] = field(default_factory=list)


class KVCacheAllocationError(MemoryError):
    """The KV cache did not fit; the message says which settings to lower."""


def kv_cache_bytes(num_layers: int, num_blocks: int, spec: FullAttentionSpec) -> int:
    return num_layers * num_blocks * spec.page_size_bytes


def allocate_kv_cache(num_layers: int, num_blocks: int, spec: FullAttentionSpec,
                      device: torch.device) -> tuple[list[torch.Tensor], KVCacheConfig]:
    """Per-layer caches [2, num_blocks, block_size, num_kv_heads, head_dim], zero-filled.

    Zeros, not torch.empty: attention over a padded block table multiplies masked-out slots by
    a zero weight, and 0 * NaN from uninitialised memory would still poison the output.
    """
    total = kv_cache_bytes(num_layers, num_blocks, spec)
    size = (f"{num_layers} layers x {num_blocks} blocks x {spec.page_size_bytes} bytes = "
            f"{total / 2**30:.2f} GiB")
    if device.type == "cpu":
        # Past what the host holds, the zero fill below would not fail but run into the OOM
        # killer (host_memory.py says why).
        available = host_available_bytes()
        if available is not None and total > available:
            raise KVCacheAllocationError(
                f"the KV cache does not fit on {device}: {size}, {available / 2**30:.2f} GiB "
                f"available (MemAvailable and the cgroup's memory limit). {LOWER_SETTINGS}")
    shape = (2, num_blocks, spec.block_size, spec.num_kv_heads, spec.head_size)
    caches: list[torch.Tensor] = []
    try:
        for _ in range(num_layers):
            caches.append(torch.zeros(shape, dtype=spec.dtype, device=device))
    except (torch.OutOfMemoryError, RuntimeError) as exc:
        # CPU allocation failures surface as a plain RuntimeError; anything else re-raises.
        if not isinstance(exc, torch.OutOfMemoryError) and "alloc" not in str(exc).lower():
            raise
        caches.clear()
        raise KVCacheAllocationError(
            f"allocating the KV cache failed on {device}: {size}. {LOWER_SETTINGS}") from exc
    groups = [KVCacheGroupSpec(kv_cache_spec=spec,
                               layer_names=tuple(f"layers.{i}" for i in range(num_layers)))]
    logger.info("KV cache: %d blocks of %d tokens (%d usable, block 0 is the null block), "
                "%d layers, %.1f MiB on %s", num_blocks, spec.block_size, num_blocks - 1,
                num_layers, total / 2**20, device)
    return caches, KVCacheConfig(num_blocks=num_blocks, kv_cache_groups=groups)
