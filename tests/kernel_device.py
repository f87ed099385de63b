"""Where a test module's Triton kernels run: tests/conftest.py sets TRITON_INTERPRET without
CUDA, so the kernels are the interpreter's and the tests use CPU tensors; with CUDA they are
compiled for the GPU and the tests use CUDA tensors."""

from __future__ import annotations

import pytest
import torch
from triton.runtime.interpreter import InterpretedFunction


def kernel_device(kernel: object) -> str:
    """"cpu" when `kernel` runs in the interpreter, else "cuda"; a module whose kernels were
    compiled for the GPU on a host without one (TRITON_INTERPRET turned off) is skipped."""
    if isinstance(kernel, InterpretedFunction):
        return "cpu"
    if not torch.cuda.is_available():
        pytest.skip("the kernels were compiled for the GPU (TRITON_INTERPRET is off) and there "
                    "is no CUDA device", allow_module_level=True)
    return "cuda"
