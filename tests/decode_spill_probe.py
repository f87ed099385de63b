"""Compile the decode kernel with its in-kernel split merge for sm_90, at the query rows,
GQA group and head size of every preset at k in {0, 3}, as the triton backend launches it for a
uniform decode (rotating q and k itself, with the q/k norm where the preset has one), and read
each binary's resource usage:
a kernel that holds too large a tile spills registers to local memory (a merge that loaded a
[splits, BLOCK_M, BLOCK_D] float32 tile of 8,192 elements spilled at BLOCK_M 32). Prints one
JSON line per distinct shape: {"presets", "GROUP", "Q_LEN", "BLOCK_M", "HEAD_DIM", "MERGE",
"ROPE", "QK_NORM", "TILE", "REG", "STACK", "MMA"} (TILE: BLOCK_N, num_warps, num_stages; MMA: the
tensor cores' products in the PTX). The probe's tensors are on the CPU, where the kernel takes
the interpreter's tile: it records with the GPU's tiles instead, each one the server picks for
some grid (decode_attention._decode_config: a narrow grid's, and from MANY_PROGRAMS on).

A program, run by tests/test_decode_spills.py without TRITON_INTERPRET; tests/sm90_compile.py
compiles without a GPU.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from tests.sm90_compile import (
    compile_for_hopper,
    constants,
    launch_options,
    record_launches,
    resource_usage,
    under_interpreter,
)
from warmgate.server.config.runner_config import ModelConfig, preset_names
from warmgate.server.kernels import decode_attention
from warmgate.server.kernels._decode_rope import DecodeRope
from warmgate.server.kernels.decode_attention import merge_counts_for, paged_attention_decode

NUM_SPLITS = 8  # any count > 1 compiles the same kernel: the count is not specialised


def _launch(num_heads: int, num_kv_heads: int, head_dim: int, q_len: int, qk_norm: bool
            ) -> None:
    q = torch.zeros(q_len, num_heads, head_dim, dtype=torch.bfloat16)
    k = torch.zeros(q_len, num_kv_heads, head_dim, dtype=torch.bfloat16)
    norm = torch.ones(head_dim, dtype=torch.bfloat16) if qk_norm else None
    rope = DecodeRope(k, k, torch.zeros(q_len, dtype=torch.int64),
                      torch.zeros(64, head_dim), torch.zeros(q_len, dtype=torch.int64),
                      norm, norm, 1e-6 if qk_norm else None)
    kv_cache = torch.zeros(2, 4, 16, num_kv_heads, head_dim, dtype=torch.bfloat16)
    block_table = torch.zeros(1, 4, dtype=torch.int32)
    seq_lens = torch.full((1,), 40, dtype=torch.int32)
    query_start_loc = torch.tensor([0, q_len], dtype=torch.int32)
    paged_attention_decode(q, kv_cache, block_table, seq_lens, query_start_loc, scale=0.1,
                           query_len=q_len, num_splits=NUM_SPLITS,
                           merge_counts=merge_counts_for(1, num_kv_heads, torch.device("cpu")),
                           rope=rope)


# Grids the server's tile choice tells apart: one request's, and a wide batch's.
GRIDS = (1, decode_attention.MANY_PROGRAMS)


@contextmanager
def _gpu_tile(programs: int) -> Iterator[None]:
    """Record the launch with the tile the GPU would run for a grid of `programs`."""
    real = decode_attention._decode_config
    decode_attention._decode_config = (
        lambda head_dim, dtype, on_gpu, _programs=0: real(head_dim, dtype, True, programs))
    try:
        yield
    finally:
        decode_attention._decode_config = real


def main() -> int:
    if under_interpreter():
        return 2
    shapes: dict[tuple[int, int, int, int, bool], list[str]] = {}
    for name in preset_names():
        model = ModelConfig.from_preset(name)
        for k in (0, 3):
            key = (model.num_heads, model.num_kv_heads, model.head_dim, 1 + k, model.qk_norm)
            shapes.setdefault(key, []).append(f"{name} k{k}")
    for key, presets in shapes.items():
        tiles = set()
        for programs in GRIDS:
            with _gpu_tile(programs):
                launches = record_launches(lambda key=key: _launch(*key))
            for fn, spec in launches:
                if fn.fn.__name__ != "_decode_kernel":
                    continue  # the split merge runs in the decode kernel: no other launch
                options = launch_options(spec)
                c = constants(fn, spec)
                tile = (c["BLOCK_N"], options["num_warps"], options["num_stages"])
                if tile in tiles:
                    continue  # this head size takes one tile for both grids
                tiles.add(tile)
                compiled = compile_for_hopper(fn, spec, ("num_warps", "num_stages"))
                usage = resource_usage(compiled.asm["cubin"])
                print(json.dumps({"presets": presets, "GROUP": c["GROUP"], "Q_LEN": c["Q_LEN"],
                                  "BLOCK_M": c["BLOCK_M"], "HEAD_DIM": c["HEAD_DIM"],
                                  "MERGE": c["MERGE"], "ROPE": c["ROPE"],
                                  "QK_NORM": c["QK_NORM"], "TILE": list(tile),
                                  "REG": usage["REG"], "STACK": usage["STACK"],
                                  "MMA": "mma." in compiled.asm["ptx"]}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
