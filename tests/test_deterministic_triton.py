"""--deterministic's CUDA path on the CPU through the Triton interpreter: the batch-invariant
ops (matmul, log-softmax, the row-wise RMSNorm) and the fixed-split attention kernel for every
batch pass the determinism phase with the attention's own split plan, and uniform decodes
take that kernel; `flashinfer` is routed to it. The phase with drafts (k = 3), on a one-layer
tiny model with the keys cut at every tile, is tests/test_fixed_split_backend.py's.

On a machine with CUDA the interpreter is not forced and the same checks run on the GPU."""

from __future__ import annotations

import dataclasses

import pytest
import torch

pytest.importorskip("triton")

from tests.kernel_device import kernel_device
from tests.runner_helpers import tiny_config
from warmgate.server.core.results import PhaseStatus
from warmgate.server.kernels.batch_invariant import _matmul_kernel
from warmgate.server.kernels.invariant_ops import BatchInvariantOps
from warmgate.server.kernels.matmul_plan import device_sm_count, planned_tiles
from warmgate.server.runner.attention import AttentionMetadata, AttentionSpec, create_backend
from warmgate.server.runner.attention.triton_backend import TritonAttentionBackend
from warmgate.server.runner.model_runner import ModelRunner
from warmgate.server.warmup.determinism import run_determinism_check

DEVICE = kernel_device(_matmul_kernel)


@pytest.mark.slow
def test_the_triton_deterministic_path_passes_the_determinism_phase(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # An intermediate size of 512 gives the down projection (64 x 512) a K split, so the
    # probe's decodes run it through the workspace and the summing kernel; the other
    # projections stay unsplit. One layer: a second would run the same kernels on the same
    # shapes (batch invariance is per launch), and the one layer still runs every norm (the
    # first without a residual, the post-attention and the final one adding it). Two query
    # heads on one KV head (GQA still): what this checks lies along the token axis, and half
    # the heads halve the attention programs; tests/test_fixed_split_attention.py checks the
    # kernel's bits over several KV heads.
    c = tiny_config(attention_backend="triton", device=DEVICE, num_layers=1, num_heads=2,
                    num_kv_heads=1, intermediate_size=512)
    c = dataclasses.replace(c, numerics=dataclasses.replace(c.numerics, deterministic=True))
    runner = ModelRunner(c, ops=BatchInvariantOps())  # type: ignore[arg-type]
    down = runner.model.layers[0].down_proj
    assert planned_tiles(*down.shape, device_sm_count(down.device)).splits > 1
    assert runner.attention_backend.spec.deterministic
    uniform = uniform_decodes_use_the_fixed_split_kernel(monkeypatch, runner)
    phase = run_determinism_check(runner, runner.execute_model, runner.sample_tokens)
    assert phase.status is PhaseStatus.RAN, phase.detail
    assert any(uniform)  # the probes' decodes were uniform ones, and none ran the split kernel


def uniform_decodes_use_the_fixed_split_kernel(monkeypatch: pytest.MonkeyPatch,
                                               runner: ModelRunner) -> list[bool]:
    """The default split decode kernel made to fail if it runs, and a record of whether each
    attention call was a uniform decode. Under the interpreter the two kernels happen to agree
    bit for bit (one split, the same tile), so only the routing itself can be checked here;
    on a GPU they differ."""
    from warmgate.server.runner.attention import triton_backend

    def forbidden(*_args: object, **_kwargs: object) -> torch.Tensor:
        raise AssertionError("the split decode kernel ran under --deterministic")

    monkeypatch.setattr(triton_backend, "paged_attention_decode", forbidden)
    seen: list[bool] = []
    real_forward = runner.attention_backend.forward

    def spy(*args: object, **kwargs: object) -> torch.Tensor:
        meta = next(a for a in [*args, *kwargs.values()] if isinstance(a, AttentionMetadata))
        seen.append(meta.is_uniform_decode)
        return real_forward(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(runner.attention_backend, "forward", spy)
    return seen


def test_deterministic_flashinfer_attention_is_the_triton_fixed_split_kernel() -> None:
    spec = AttentionSpec(num_heads=4, num_kv_heads=2, head_dim=16, block_size=4, num_blocks=8,
                         max_blocks_per_req=4, max_num_reqs=2, max_num_tokens=16,
                         dtype=torch.float32, device=torch.device(DEVICE), deterministic=True)
    assert isinstance(create_backend("flashinfer", spec), TritonAttentionBackend)
