"""The interpreter's nested patching skipped (tests/interpreter_patching.py): a kernel with
nested jit calls computes the same, the language is restored after each launch, and the
patching no longer grows with the programs of the grid."""

from __future__ import annotations

import os

import pytest
import torch
import triton
import triton.language as tl

from tests import interpreter_patching

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                reason="the Triton interpreter's patching only")


@triton.jit
def _twice(x):
    return x * 2


@triton.jit
def _twice_plus_sum_kernel(x_ptr, y_ptr, N: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, N)
    x = tl.load(x_ptr + row * N + offs)
    tl.store(y_ptr + row * N + offs, _twice(x) + tl.sum(x, axis=0))


def _launch(rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.arange(rows * 16, dtype=torch.float32).reshape(rows, 16)
    y = torch.empty_like(x)
    _twice_plus_sum_kernel[(rows,)](x, y, N=16)
    return x, y


def test_a_kernel_with_nested_calls_computes_the_same() -> None:
    assert interpreter_patching.skip_nested_patches()
    x, y = _launch(8)
    torch.testing.assert_close(y, 2 * x + x.sum(dim=1, keepdim=True), rtol=0, atol=0)


def test_the_language_is_restored_after_a_launch() -> None:
    assert interpreter_patching.skip_nested_patches()
    _launch(2)
    # The originals are Triton builtins; the interpreter's stand-ins are plain lambdas.
    assert tl.core.is_builtin(tl.arange) and tl.core.is_builtin(tl.load)


def test_patching_no_longer_grows_with_the_grid(monkeypatch: pytest.MonkeyPatch) -> None:
    from triton.runtime import interpreter

    assert interpreter_patching.skip_nested_patches()
    calls = []
    original = interpreter._patch_builtin

    def counting(*args: object, **kwargs: object) -> object:
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(interpreter, "_patch_builtin", counting)
    per_launch = []
    for rows in (1, 8):
        calls.clear()
        _launch(rows)
        per_launch.append(len(calls))
    assert per_launch[0] == per_launch[1] > 0, per_launch
