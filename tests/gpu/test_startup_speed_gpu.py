"""Issue 20 on the GPU: the profiler probe of the shape sweeps' kernel map, and the staged
weight reader (pinned slices, side stream) into CUDA tensors."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from tests.runner_helpers import make_runner
from warmgate.server.config.weight_files import read_header
from warmgate.server.runner.weight_stream import stream_into
from warmgate.server.warmup.gemm_shapes import gemm_plan, gemm_sweep, sweep_gemm_shapes
from warmgate.server.warmup.kernel_probe import covering_sizes
from warmgate.server.warmup.sampler_rows import sampler_sweeps, sweep_sampler_rows
from warmgate.server.warmup.size_sweeps import profile_sweep

pytestmark = pytest.mark.gpu


def test_the_profiler_sees_each_m_and_few_first_launches() -> None:
    weight = torch.randn(6144, 2048, device="cuda", dtype=torch.bfloat16)
    signatures = profile_sweep(gemm_sweep(weight, 512))
    assert len(signatures) == 512
    assert all(signatures), "every M launched at least one kernel"
    sizes = covering_sizes(signatures)
    assert sizes[0] == 1 and len(sizes) < 512 // 4, sizes
    # Deterministic: a second profile makes the same choices.
    assert covering_sizes(profile_sweep(gemm_sweep(weight, 512))) == sizes


def test_a_kept_map_sweeps_fewer_gemms_on_cuda(tmp_path: Path) -> None:
    runner = make_runner(device="cuda", dtype="bfloat16", max_num_seqs=16,
                         max_num_batched_tokens=512)
    full = sum(m for _, m in gemm_plan(runner))
    assert sweep_gemm_shapes(runner, kernel_dir=tmp_path) == full  # learns
    assert sweep_gemm_shapes(runner, kernel_dir=tmp_path) < full  # uses it


def test_the_sampler_rows_learn_a_smaller_map_on_cuda(tmp_path: Path) -> None:
    runner = make_runner(device="cuda", dtype="bfloat16", num_spec=2, max_num_seqs=64)
    sweeps = sampler_sweeps(runner)
    full = sum(s.max_size for s in sweeps)
    assert all(profile_sweep(s)[0] for s in sweeps), "size 1 of every sweep launched kernels"
    assert sweep_sampler_rows(runner, kernel_dir=tmp_path) == full  # learns
    assert sweep_sampler_rows(runner, kernel_dir=tmp_path) < full // 2  # uses it


@pytest.mark.parametrize("file_dtype", [torch.bfloat16, torch.float32])
def test_staged_reader_fills_cuda_tensors(tmp_path: Path, file_dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(0)
    tensors = {f"t{i}": torch.randn(n, 257, generator=gen).to(file_dtype)
               for i, n in enumerate((1, 3, 700, 40_000))}
    path = tmp_path / "model.safetensors"
    save_file(tensors, str(path))
    header = read_header(path)
    targets = {n: torch.zeros(t.shape, dtype=torch.bfloat16, device="cuda")
               for n, t in tensors.items()}
    stats = stream_into([(path, header[n], targets[n]) for n in tensors], torch.device("cuda"),
                        slice_bytes=1 << 20, num_readers=4)
    assert stats.staged
    for name, t in tensors.items():
        assert torch.equal(targets[name].cpu(), t.to(torch.bfloat16)), name
