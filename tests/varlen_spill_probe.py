"""Compile the varlen attention kernel for sm_90 at the GQA group and head size of every
preset, as a mixed step launches it (the prompts' launch of wide tiles, then the decodes'
launch of small ones), and read each binary's resource usage. Prints one JSON line per
distinct launch: {"presets", "SELECT", "GROUP", "BLOCK_M", "HEAD_DIM", "num_warps", "REG",
"STACK", "SHARED" (bytes of shared memory a program), "MMA"}.

A program, run by tests/test_varlen_spills.py without TRITON_INTERPRET; tests/sm90_compile.py
compiles without a GPU. The probe's tensors are on the CPU, where the launch would take the
interpreter's tiles: it takes the GPU's (varlen_tiles with on_gpu).
"""

from __future__ import annotations

import json
import sys

import torch

import warmgate.server.kernels.varlen_attention as varlen_attention
from tests.sm90_compile import (
    compile_for_hopper,
    constants,
    launch_options,
    presets_by_shape,
    record_launches,
    resource_usage,
    under_interpreter,
)

_CPU_TILES = varlen_attention.varlen_tiles


def _launch(num_heads: int, num_kv_heads: int, head_dim: int) -> None:
    q = torch.zeros(9, num_heads, head_dim, dtype=torch.bfloat16)
    kv_cache = torch.zeros(2, 4, 16, num_kv_heads, head_dim, dtype=torch.bfloat16)
    block_table = torch.zeros(2, 4, dtype=torch.int32)
    seq_lens = torch.tensor([40, 8], dtype=torch.int32)
    query_start_loc = torch.tensor([0, 1, 9], dtype=torch.int32)  # a decode beside a prompt
    varlen_attention.paged_attention_varlen(q, kv_cache, block_table, seq_lens,
                                            query_start_loc, scale=0.1, max_query_len=8)


def main() -> int:
    if under_interpreter():
        return 2
    varlen_attention.varlen_tiles = lambda head_dim, dtype, on_gpu: _CPU_TILES(
        head_dim, dtype, True)
    shapes = presets_by_shape(lambda model: (model.num_heads, model.num_kv_heads,
                                             model.head_dim))
    for key, presets in shapes.items():
        for fn, spec in record_launches(lambda key=key: _launch(*key)):
            c = constants(fn, spec)
            compiled = compile_for_hopper(fn, spec, ("num_warps", "num_stages"))
            usage = resource_usage(compiled.asm["cubin"])
            options = launch_options(spec)
            print(json.dumps({"presets": presets, "SELECT": c["SELECT"], "GROUP": c["GROUP"],
                              "BLOCK_M": c["BLOCK_M"], "HEAD_DIM": c["HEAD_DIM"],
                              "num_warps": options["num_warps"], "REG": usage["REG"],
                              "STACK": usage["STACK"], "SHARED": compiled.metadata.shared,
                              "MMA": "mma." in compiled.asm["ptx"]}),
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
