"""The Triton decode kernel under the old and the new split-K rule, side by side, in a CUDA
graph (the way the server runs it: no launch overhead in the figure).

Each captured graph runs the kernel once per "layer": every layer reads its own pages of one
shared cache, so the K/V bytes cross HBM (the whole working set is many times the L2) as a
model's layers would. GB/s counts the K/V bytes a call must read; % HBM is that against the
detected card's bandwidth (devtools.gpu_card). Used by `python bench/serve.py kernels`
(kernels_gpu.py).

A third table sweeps the kernel's tile configuration (BLOCK_N, num_warps, num_stages; the
server's, decode_attention._decode_config, first and marked in each row, since it follows the
grid) and a fourth the split count with the server's tile, at batches 64 and 128, where the
rule gives one split (a program for each request and KV head, a few an SM): one device run
shows whether another tile or more splits read the cache faster. Every call merges its
splits in the kernel, as the server's do (merge_counts).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import triton
from graph_timing import graph_us

from warmgate.server.kernels import choose_num_splits, decode_attention, paged_attention_decode
from warmgate.server.kernels.decode_attention import merge_counts_for

NUM_HEADS, NUM_KV_HEADS, BLOCK_SIZE = 32, 8, 16
BATCHES = (1, 8, 64, 128)
CONTEXTS = (512, 2048)
# The working set a graph's calls read, at least: several times an H100's or H200's 50 MB L2.
MIN_WORKING_SET = 512 << 20
MAX_LAYERS = 512
REPLAYS = 20
# (BLOCK_N, num_warps, num_stages) besides the server's (printed first).
TILE_CONFIGS = ((64, 4, 3), (32, 4, 3), (64, 4, 2), (64, 8, 3), (128, 8, 2), (32, 2, 4),
                (16, 4, 4), (64, 2, 2), (128, 4, 2))
TILE_BATCHES = (64, 128)
SPLIT_COUNTS = (1, 2, 4, 8)


def old_num_splits(num_reqs: int, num_kv_heads: int, max_context_len: int,
                   num_sms: int) -> int:
    """The rule the server used before: ~2 programs per SM rounded DOWN to a power of two,
    at most 16 splits, each of >= 256 tokens of the capacity."""
    programs = max(num_reqs * num_kv_heads, 1)
    wanted = triton.cdiv(2 * num_sms, programs)
    useful = max(max_context_len // 256, 1)
    splits = min(wanted, useful, 16)
    return 1 << (splits.bit_length() - 1)


@dataclass
class SplitTiming:
    splits: int
    us: float  # median per call
    gbps: float

    def hbm_pct(self, bytes_per_s: float) -> float:
        return 100.0 * self.gbps * 1e9 / bytes_per_s


def _time_splits(batch: int, context: int, head_dim: int, splits: int) -> SplitTiming:
    dev, dtype = torch.device("cuda"), torch.bfloat16
    blocks_per_req = -(-context // BLOCK_SIZE)
    kv_bytes = 2 * batch * context * NUM_KV_HEADS * head_dim * 2  # per call
    layers = max(2, min(MAX_LAYERS, -(-MIN_WORKING_SET // kv_bytes)))
    num_blocks = 1 + layers * batch * blocks_per_req
    kv_cache = torch.empty(2, num_blocks, BLOCK_SIZE, NUM_KV_HEADS, head_dim, device=dev,
                           dtype=dtype).normal_()
    # Shuffled pages, as a long-running server's would be; each layer its own.
    pages = (torch.randperm(num_blocks - 1, device=dev).to(torch.int32) + 1)
    tables = pages.view(layers, batch, blocks_per_req)  # [L, B, blocks_per_req]
    seq_lens = torch.full((batch,), context, dtype=torch.int32, device=dev)
    qsl = torch.arange(batch + 1, dtype=torch.int32, device=dev)
    q = torch.randn(batch, NUM_HEADS, head_dim, device=dev, dtype=dtype)  # [B, Hq, D]
    out = torch.empty_like(q)
    scale = head_dim ** -0.5
    counts = merge_counts_for(batch, NUM_KV_HEADS, dev)
    us = graph_us(lambda layer: paged_attention_decode(
        q, kv_cache, tables[layer], seq_lens, qsl, scale=scale, query_len=1,
        num_splits=splits, out=out, merge_counts=counts), layers, REPLAYS)
    return SplitTiming(splits=splits, us=us, gbps=kv_bytes / (us * 1e-6) / 1e9)


def print_split_comparison(head_dims: tuple[int, ...], capacity: int, bytes_per_s: float
                           ) -> None:
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"\ndecode attention split-K: old rule vs new (choose_num_splits), CUDA graph, "
          f"{NUM_HEADS}/{NUM_KV_HEADS} heads, bf16, capacity {capacity} tokens, {sms} SMs; "
          f"us per call, GB/s and % of {bytes_per_s / 1e12:.2f} TB/s HBM")
    print(f"{'D':>4}{'batch':>6}{'ctx':>6} | {'splits':>6}{'us':>9}{'GB/s':>7}{'%HBM':>6} | "
          f"{'splits':>6}{'us':>9}{'GB/s':>7}{'%HBM':>6} | {'new/old':>7}")
    for head_dim in head_dims:
        for context in CONTEXTS:
            for batch in BATCHES:
                old = _time_splits(batch, context, head_dim,
                                   old_num_splits(batch, NUM_KV_HEADS, capacity, sms))
                new_splits = choose_num_splits(batch, NUM_KV_HEADS, capacity, sms)
                new = (old if new_splits == old.splits
                       else _time_splits(batch, context, head_dim, new_splits))
                print(f"{head_dim:>4}{batch:>6}{context:>6} | {old.splits:>6}{old.us:>9.2f}"
                      f"{old.gbps:>7.0f}{old.hbm_pct(bytes_per_s):>6.1f} | {new.splits:>6}"
                      f"{new.us:>9.2f}{new.gbps:>7.0f}{new.hbm_pct(bytes_per_s):>6.1f} | "
                      f"{new.us / old.us:>7.2f}")
                torch.cuda.empty_cache()  # the next shape's cache may be gigabytes


@contextmanager
def _tile_config(config: tuple[int, int, int]) -> Iterator[None]:
    """Run the decode kernel with `config` instead of the server's tile choice."""
    real = decode_attention._decode_config
    decode_attention._decode_config = lambda head_dim, dtype, on_gpu, programs=0: config
    try:
        yield
    finally:
        decode_attention._decode_config = real


def server_tile(head_dim: int, batch: int) -> tuple[int, int, int]:
    """The server's (BLOCK_N, num_warps, num_stages) for bf16 on the GPU at this head_dim and
    batch (of NUM_KV_HEADS KV heads)."""
    return decode_attention._decode_config(head_dim, torch.bfloat16, True, batch * NUM_KV_HEADS)


def tile_configs(head_dim: int) -> list[tuple[int, int, int]]:
    """The server's tiles at TILE_BATCHES, then the others of TILE_CONFIGS."""
    servers = list(dict.fromkeys(server_tile(head_dim, b) for b in TILE_BATCHES))
    return [*servers, *(c for c in TILE_CONFIGS if c not in servers)]


def print_tile_sweep(head_dims: tuple[int, ...], capacity: int, bytes_per_s: float) -> None:
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print("\ndecode attention tile configurations (BLOCK_N/num_warps/num_stages), CUDA graph, "
          "split by the new rule; % of HBM per configuration, * = the server's for the row")
    for head_dim in head_dims:
        configs = tile_configs(head_dim)
        names = "".join(f"{'/'.join(map(str, c)):>10}" for c in configs)
        print(f"{'D':>4}{'batch':>6}{'ctx':>6}{names}")
        for context in CONTEXTS:
            for batch in TILE_BATCHES:
                splits = choose_num_splits(batch, NUM_KV_HEADS, capacity, sms)
                server = server_tile(head_dim, batch)
                cells = []
                for config in configs:
                    mark = "*" if config == server else " "
                    try:
                        with _tile_config(config):
                            t = _time_splits(batch, context, head_dim, splits)
                        cells.append(f"{t.hbm_pct(bytes_per_s):>9.1f}{mark}")
                    except Exception as exc:  # e.g. OutOfResources: that tile does not fit
                        cells.append(f"{type(exc).__name__[:8]:>9}{mark}")
                    torch.cuda.empty_cache()
                print(f"{head_dim:>4}{batch:>6}{context:>6}{''.join(cells)}")


def print_split_sweep(head_dims: tuple[int, ...], capacity: int, bytes_per_s: float) -> None:
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print("\ndecode attention split counts with the server's tile, CUDA graph, splits merged in "
          "the kernel; % of HBM per count, * = the rule's (choose_num_splits)")
    print(f"{'D':>4}{'batch':>6}{'ctx':>6}" + "".join(f"{n:>9}" for n in SPLIT_COUNTS))
    for head_dim in head_dims:
        for context in CONTEXTS:
            for batch in TILE_BATCHES:
                rule = choose_num_splits(batch, NUM_KV_HEADS, capacity, sms)
                cells = []
                for splits in SPLIT_COUNTS:
                    t = _time_splits(batch, context, head_dim, splits)
                    mark = "*" if splits == rule else " "
                    cells.append(f"{t.hbm_pct(bytes_per_s):>8.1f}{mark}")
                    torch.cuda.empty_cache()
                print(f"{head_dim:>4}{batch:>6}{context:>6}{''.join(cells)}")
