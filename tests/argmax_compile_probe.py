"""Compile the sampler's chunked argmax (kernels/row_argmax.py) for sm_90, as the sampler
launches it on a 128k vocabulary in each dtype its rows come in (the model's, and float32 once
processors, a grammar or temperature touched them), and read each binary's resource usage: the
interpreter runs kernels the GPU's compiler refuses (a plain global read inside a kernel).
Prints one JSON line per (dtype, kernel): {"dtype", "kernel", "REG", "STACK"}.

A program, run by tests/test_row_argmax.py without TRITON_INTERPRET; tests/sm90_compile.py
compiles without a GPU.
"""

from __future__ import annotations

import json
import sys

import torch

from tests.sm90_compile import (
    compile_for_hopper,
    record_launches,
    resource_usage,
    under_interpreter,
)
from warmgate.server.kernels.row_argmax import row_argmax

VOCAB = 128_256


def main() -> int:
    if under_interpreter():
        return 2
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        x = torch.zeros(4, VOCAB, dtype=dtype)
        for fn, spec in record_launches(lambda x=x: row_argmax(x)):
            usage = resource_usage(compile_for_hopper(fn, spec, ("num_warps", "num_stages"))
                                   .asm["cubin"])
            print(json.dumps({"dtype": str(dtype), "kernel": fn.__name__, "REG": usage["REG"],
                              "STACK": usage["STACK"]}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
