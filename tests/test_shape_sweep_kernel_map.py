"""The shape sweeps' kernel maps: learned once by the full sweep (a fake probe stands in for the
profiler here), kept in the compile-cache entry, trusted only for the same GPU, libraries and
sweeps; anything else sweeps every size again. GEMMs and sampler rows alike."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from tests.runner_helpers import make_runner
from warmgate.server.cache import CACHE_ENV_VARS, apply_cache_env
from warmgate.server.cache.shape_sweeps import ENV_VAR, GEMM_FILE, kernel_map_dir
from warmgate.server.warmup import gemm_shapes, size_sweeps
from warmgate.server.warmup.gemm_shapes import gemm_key, gemm_plan, sweep_gemm_shapes
from warmgate.server.warmup.kernel_probe import (
    MARKER,
    ProbeError,
    covering_sizes,
    split_at_markers,
)
from warmgate.server.warmup.size_sweeps import SizeSweep

FILE_NAME = GEMM_FILE

# Kernel changes at these Ms (as cuBLAS switches tiles): 1-8 "small", 9-63 "mid", 64+ "big".
BOUNDARIES = ((64, "big"), (9, "mid"), (1, "small"))


def _kernel(m: int) -> str:
    return next(name for start, name in BOUNDARIES if m >= start)


def fake_probe(calls: list[tuple[str, int]]) -> Callable[[SizeSweep], list[tuple[str, ...]]]:
    """Runs every size (as the profiler does) and names its kernel by BOUNDARIES."""
    def probe(sweep: SizeSweep) -> list[tuple[str, ...]]:
        calls.append((sweep.key, sweep.max_size))
        for m in range(1, sweep.max_size + 1):
            sweep.call(m)
        return [(f"k_{_kernel(m)}_{sweep.key}",) for m in range(1, sweep.max_size + 1)]
    return probe


def _no_probe(sweep: SizeSweep) -> list[tuple[str, ...]]:
    raise AssertionError("a kept kernel map must not be probed again")


@pytest.fixture
def linear_ms(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The M of every GEMM the sweep runs itself."""
    seen: list[int] = []
    real = gemm_shapes.F.linear

    def counting(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        seen.append(x.shape[0])
        return real(x, w)

    monkeypatch.setattr(gemm_shapes.F, "linear", counting)
    return seen


def test_covering_sizes_keeps_each_first_launch_and_every_unknown() -> None:
    signatures = [("a",), ("a",), ("b",), ("a",), (), ("c", "r"), ("c", "r")]
    assert covering_sizes(signatures) == [1, 3, 5, 6]
    # A new sequence of kernels already launched (b then a; a alone) adds no size.
    signatures = [("a",), ("a", "b"), ("b", "a"), ("b",), ("a", "r"), ("r", "b")]
    assert covering_sizes(signatures) == [1, 2, 5]


def test_sizes_to_keep_adds_the_largest() -> None:
    assert size_sweeps.sizes_to_keep([("a",), ("a",), ("a",)]) == [1, 3]
    assert size_sweeps.sizes_to_keep([("a",), ("b",)]) == [1, 2]


def test_split_at_markers_gives_each_m_its_kernels_or_refuses() -> None:
    names = ["gemm_a", f"{MARKER}(long)", "memset", "gemm_b", f"{MARKER}(long)"]
    assert split_at_markers(names, 2) == [("gemm_a",), ("memset", "gemm_b")]
    with pytest.raises(ProbeError):
        split_at_markers(names, 3)  # a dropped marker would shift every later M
    with pytest.raises(ProbeError):
        split_at_markers([*names, "gemm_c"], 2)


def test_learn_once_then_sweep_only_the_first_launches(tmp_path: Path,
                                                     linear_ms: list[int]) -> None:
    runner = make_runner(max_num_seqs=8, max_num_batched_tokens=128)
    plan = gemm_plan(runner)
    full = sum(m for _, m in plan)
    probed: list[tuple[str, int]] = []
    assert sweep_gemm_shapes(runner, kernel_dir=tmp_path, probe=fake_probe(probed)) == full
    assert probed == [(gemm_key(w, m), m) for w, m in plan]
    kept = json.loads((tmp_path / FILE_NAME).read_text())
    layer_key = gemm_key(*plan[0])
    # The first M of each kernel, and the largest (its temporaries are the biggest).
    assert kept["sizes"][layer_key] == [1, 9, 64, 128]
    assert plan[-1][1] == 8 and kept["sizes"][gemm_key(*plan[-1])] == [1, 8]  # head: 8 rows
    linear_ms.clear()
    warm = sweep_gemm_shapes(runner, kernel_dir=tmp_path, probe=_no_probe)
    assert warm == sum(len(v) for v in kept["sizes"].values()) < full
    assert linear_ms == [m for w, mm in plan for m in kept["sizes"][gemm_key(w, mm)]]


def _learn(runner: object, directory: Path) -> None:
    sweep_gemm_shapes(runner, kernel_dir=directory, probe=fake_probe([]))


def test_a_map_of_another_gpu_or_torch_is_not_trusted(tmp_path: Path) -> None:
    runner = make_runner(max_num_seqs=8, max_num_batched_tokens=128)
    _learn(runner, tmp_path)
    path = tmp_path / FILE_NAME
    data = json.loads(path.read_text())
    data["identity"]["torch"] = "0.0.1"
    path.write_text(json.dumps(data))
    probed: list[tuple[str, int]] = []
    full = sum(m for _, m in gemm_plan(runner))
    assert sweep_gemm_shapes(runner, kernel_dir=tmp_path, probe=fake_probe(probed)) == full
    assert probed  # learned again, for this identity
    assert json.loads(path.read_text())["identity"]["torch"] == torch.__version__


def test_a_map_without_this_budget_sweeps_everything(tmp_path: Path) -> None:
    _learn(make_runner(max_num_seqs=8, max_num_batched_tokens=128), tmp_path)
    bigger = make_runner(max_num_seqs=8, max_num_batched_tokens=256)
    full = sum(m for _, m in gemm_plan(bigger))
    assert sweep_gemm_shapes(bigger, kernel_dir=tmp_path, probe=fake_probe([])) == full


@pytest.mark.parametrize("content", ["{not json", '{"version": 99, "identity": {}, '
                                                  '"sizes": {}}'])
def test_an_unreadable_map_sweeps_everything(tmp_path: Path, content: str) -> None:
    runner = make_runner(max_num_seqs=8, max_num_batched_tokens=128)
    (tmp_path / FILE_NAME).write_text(content)
    full = sum(m for _, m in gemm_plan(runner))
    assert sweep_gemm_shapes(runner, kernel_dir=tmp_path, probe=fake_probe([])) == full


def test_without_a_cache_every_size_runs_and_nothing_is_probed(linear_ms: list[int]) -> None:
    runner = make_runner(max_num_seqs=8, max_num_batched_tokens=128)
    plan = gemm_plan(runner)
    assert sweep_gemm_shapes(runner, probe=_no_probe) == sum(m for _, m in plan)
    assert linear_ms == [m for _, mm in plan for m in range(1, mm + 1)]


def _raises(sweep: SizeSweep) -> list[tuple[str, ...]]:
    raise ProbeError("the profile holds 3 markers")


def _one_short(sweep: SizeSweep) -> list[tuple[str, ...]]:
    return [("k",)] * (sweep.max_size - 1)  # a map from it would leave the largest size out


@pytest.mark.parametrize("broken", [_raises, _one_short])
def test_a_failed_probe_sweeps_plainly_and_keeps_nothing(
        tmp_path: Path, linear_ms: list[int],
        broken: Callable[[SizeSweep], list[tuple[str, ...]]]) -> None:
    runner = make_runner(max_num_seqs=8, max_num_batched_tokens=128)
    plan = gemm_plan(runner)

    assert sweep_gemm_shapes(runner, kernel_dir=tmp_path, probe=broken) == sum(
        m for _, m in plan)
    assert linear_ms == [m for _, mm in plan for m in range(1, mm + 1)]
    assert not (tmp_path / FILE_NAME).exists()


def test_a_device_failure_inside_the_probe_is_not_taken_for_a_failed_probe(
        tmp_path: Path) -> None:
    runner = make_runner(max_num_seqs=8, max_num_batched_tokens=128)

    def lost(sweep: SizeSweep) -> list[tuple[str, ...]]:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    with pytest.raises(RuntimeError, match="illegal memory access"):
        sweep_gemm_shapes(runner, kernel_dir=tmp_path, probe=lost)


def test_a_map_that_cannot_be_written_costs_the_warmup_nothing(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    runner = make_runner(max_num_seqs=8, max_num_batched_tokens=128)
    blocked = tmp_path / "shape_sweeps"
    blocked.write_text("a file where the directory should be")
    caplog.set_level("INFO", logger=size_sweeps.__name__)
    full = sum(m for _, m in gemm_plan(runner))
    assert sweep_gemm_shapes(runner, kernel_dir=blocked, probe=fake_probe([])) == full
    assert "not kept" in caplog.text and "the next start sweeps every size" in caplog.text


def test_the_cache_entry_holds_the_kernel_map(tmp_path: Path) -> None:
    env: dict[str, str] = {}
    apply_cache_env(tmp_path / "entry", env)
    assert CACHE_ENV_VARS[ENV_VAR] == "shape_sweeps"
    assert kernel_map_dir(env) == tmp_path / "entry" / "shape_sweeps"
    assert kernel_map_dir({}) is None


def test_a_gemm_sweep_holds_its_input_only_while_it_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """The plan's sweeps are built at once; each allocates its input at its first call and
    drops it at its last (max M), so only one is alive at a time."""
    import weakref

    made: list[weakref.ref[torch.Tensor]] = []
    real_zeros = torch.zeros

    def zeros(*args: object, **kwargs: object) -> torch.Tensor:
        t = real_zeros(*args, **kwargs)
        made.append(weakref.ref(t))
        return t

    monkeypatch.setattr(gemm_shapes.torch, "zeros", zeros)
    weight = torch.randn(6, 4)
    sweep = gemm_shapes.gemm_sweep(weight, 3)
    assert not made  # building the sweep allocates nothing
    sweep.call(1)
    sweep.call(2)
    assert len(made) == 1 and made[0]() is not None
    sweep.call(3)
    assert made[0]() is None  # released at max M
    sweep.call(1)  # a second run allocates again
    assert len(made) == 2
