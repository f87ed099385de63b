"""Compile the dense GEMV with its RMSNorm and SiLU-and-mul fused in (kernels/norm_gemv.py's
norm_act_gemv) for sm_90, as the triton ops launch it on every dense preset's gate/up
projection, at one row and at the 16-row tile, and read each binary's resource usage: a fused
epilogue that holds too much at once spills registers to local memory. Prints one JSON line per
distinct (gate/up shape, row bucket): {"presets", "N", "K", "BLOCK_M", "BLOCK_N", "REG",
"STACK"}.

A program, run by tests/test_gemv_spills.py without TRITON_INTERPRET; tests/sm90_compile.py
compiles without a GPU.
"""

from __future__ import annotations

import json
import sys

import torch

from tests.sm90_compile import (
    compile_for_hopper,
    constants,
    presets_by_shape,
    record_launches,
    resource_usage,
    under_interpreter,
)
from warmgate.server.kernels.gemv_plan import MAX_ROWS
from warmgate.server.kernels.norm_gemv import norm_act_gemv

H100_SMS = 132


def _launch(two_inter: int, hidden: int, rows: int) -> None:
    x = torch.zeros(rows, hidden, dtype=torch.bfloat16)
    gate_up = torch.zeros(two_inter, hidden, dtype=torch.bfloat16)
    norm_act_gemv(x, x, x[0], 1e-6, gate_up, sm_count=H100_SMS)


def main() -> int:
    if under_interpreter():
        return 2
    # The MoE experts and FP8 projections run other kernels.
    shapes = presets_by_shape(lambda model: None if model.num_experts or model.fp8 is not None
                              else (2 * model.intermediate_size, model.hidden_size))
    for (n, k), presets in shapes.items():
        for rows in (1, MAX_ROWS):
            for fn, spec in record_launches(lambda n=n, k=k, rows=rows: _launch(n, k, rows)):
                c = constants(fn, spec)
                usage = resource_usage(compile_for_hopper(fn, spec, ("num_warps", "num_stages"))
                                       .asm["cubin"])
                print(json.dumps({"presets": presets, "N": n, "K": k, "BLOCK_M": c["BLOCK_M"],
                                  "BLOCK_N": c["BLOCK_N"], "ACT": c["ACT"], "REG": usage["REG"],
                                  "STACK": usage["STACK"]}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
