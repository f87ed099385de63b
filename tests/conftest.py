"""Loaded before any test module is imported. Without CUDA, the Triton kernels run in the
interpreter, and Triton reads TRITON_INTERPRET when a kernel is defined: the moment the first
module that imports the runner's kernels is collected, whichever test file that is. So the
switch is set here, once, before collection, not in the files that test the kernels."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
