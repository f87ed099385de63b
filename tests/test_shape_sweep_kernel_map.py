"""The shape sweeps' kernel maps (size_sweeps.run_size_sweeps, which the sampler rows use):
learned once by the full sweep (a fake probe stands in for the profiler here), kept in the
compile-cache entry, trusted only for the same GPU, libraries and sweeps; anything else sweeps
every size again. The sweeps here are synthetic: each records the sizes it is called at."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from warmgate.server.cache import CACHE_ENV_VARS, apply_cache_env
from warmgate.server.cache.shape_sweeps import ENV_VAR, kernel_map_dir
from warmgate.server.warmup import size_sweeps
from warmgate.server.warmup.kernel_probe import (
    MARKER,
    ProbeError,
    covering_sizes,
    split_at_markers,
)
from warmgate.server.warmup.size_sweeps import SizeSweep, run_size_sweeps

FILE_NAME = "test_kernels.json"

# Kernel changes at these sizes: 1-8 "small", 9-63 "mid", 64+ "big".
BOUNDARIES = ((64, "big"), (9, "mid"), (1, "small"))

Probe = Callable[[SizeSweep], list[tuple[str, ...]]]


def _kernel(m: int) -> str:
    return next(name for start, name in BOUNDARIES if m >= start)


def fake_probe(calls: list[tuple[str, int]]) -> Probe:
    """Runs every size (as the profiler does) and names its kernel by BOUNDARIES."""
    def probe(sweep: SizeSweep) -> list[tuple[str, ...]]:
        calls.append((sweep.key, sweep.max_size))
        for m in range(1, sweep.max_size + 1):
            sweep.call(m)
        return [(f"k_{_kernel(m)}_{sweep.key}",) for m in range(1, sweep.max_size + 1)]
    return probe


def _no_probe(sweep: SizeSweep) -> list[tuple[str, ...]]:
    raise AssertionError("a kept kernel map must not be probed again")


def family(calls: list[tuple[str, int]], **max_sizes: int) -> list[SizeSweep]:
    """One sweep per keyword (its key, sizes 1..value), each call recorded in `calls`."""
    def sweep(key: str, max_size: int) -> SizeSweep:
        return SizeSweep(key, max_size, lambda m: calls.append((key, m)), torch.device("cpu"))
    return [sweep(key, n) for key, n in max_sizes.items()]


def run(sweeps: list[SizeSweep], directory: Path | None, probe: Probe) -> int:
    return run_size_sweeps(sweeps, what="test sweeps", file_name=FILE_NAME,
                           kernel_dir=directory, probe=probe)


def _full(sweeps: list[SizeSweep]) -> int:
    return sum(s.max_size for s in sweeps)


def _every_size(sweeps: list[SizeSweep]) -> list[tuple[str, int]]:
    return [(s.key, m) for s in sweeps for m in range(1, s.max_size + 1)]


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


def test_learn_once_then_sweep_only_the_first_launches(tmp_path: Path) -> None:
    calls: list[tuple[str, int]] = []
    sweeps = family(calls, a=128, b=8)
    probed: list[tuple[str, int]] = []
    assert run(sweeps, tmp_path, fake_probe(probed)) == _full(sweeps)
    assert probed == [("a", 128), ("b", 8)]
    kept = json.loads((tmp_path / FILE_NAME).read_text())["sizes"]
    # The first size of each kernel, and the largest (its temporaries are the biggest).
    assert kept == {"a": [1, 9, 64, 128], "b": [1, 8]}
    calls.clear()
    assert run(sweeps, tmp_path, _no_probe) == 6
    assert calls == [("a", 1), ("a", 9), ("a", 64), ("a", 128), ("b", 1), ("b", 8)]


def test_a_map_of_another_gpu_or_torch_is_not_trusted(tmp_path: Path) -> None:
    sweeps = family([], a=128)
    run(sweeps, tmp_path, fake_probe([]))
    path = tmp_path / FILE_NAME
    data = json.loads(path.read_text())
    data["identity"]["torch"] = "0.0.1"
    path.write_text(json.dumps(data))
    probed: list[tuple[str, int]] = []
    assert run(sweeps, tmp_path, fake_probe(probed)) == 128
    assert probed  # learned again, for this identity
    assert json.loads(path.read_text())["identity"]["torch"] == torch.__version__


def test_a_map_without_one_of_the_sweeps_sweeps_everything(tmp_path: Path) -> None:
    run(family([], a=128), tmp_path, fake_probe([]))
    bigger = family([], a=128, a_at_256=256)  # a new budget names a new sweep
    probed: list[tuple[str, int]] = []
    assert run(bigger, tmp_path, fake_probe(probed)) == 384
    assert probed == [("a", 128), ("a_at_256", 256)]


@pytest.mark.parametrize("content", ["{not json", '{"version": 99, "identity": {}, '
                                                  '"sizes": {}}'])
def test_an_unreadable_map_sweeps_everything(tmp_path: Path, content: str) -> None:
    (tmp_path / FILE_NAME).write_text(content)
    assert run(family([], a=128), tmp_path, fake_probe([])) == 128


def test_without_a_cache_every_size_runs_and_nothing_is_probed() -> None:
    calls: list[tuple[str, int]] = []
    sweeps = family(calls, a=16, b=3)
    assert run(sweeps, None, _no_probe) == 19
    assert calls == _every_size(sweeps)


def _raises(sweep: SizeSweep) -> list[tuple[str, ...]]:
    raise ProbeError("the profile holds 3 markers")


def _one_short(sweep: SizeSweep) -> list[tuple[str, ...]]:
    return [("k",)] * (sweep.max_size - 1)  # a map from it would leave the largest size out


@pytest.mark.parametrize("broken", [_raises, _one_short])
def test_a_failed_probe_sweeps_plainly_and_keeps_nothing(tmp_path: Path,
                                                         broken: Probe) -> None:
    calls: list[tuple[str, int]] = []
    sweeps = family(calls, a=16, b=3)
    assert run(sweeps, tmp_path, broken) == 19
    assert calls[-19:] == _every_size(sweeps)
    assert not (tmp_path / FILE_NAME).exists()


def test_a_device_failure_inside_the_probe_is_not_taken_for_a_failed_probe(
        tmp_path: Path) -> None:
    def lost(sweep: SizeSweep) -> list[tuple[str, ...]]:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    with pytest.raises(RuntimeError, match="illegal memory access"):
        run(family([], a=16), tmp_path, lost)


def test_a_map_that_cannot_be_written_costs_the_warmup_nothing(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    blocked = tmp_path / "shape_sweeps"
    blocked.write_text("a file where the directory should be")
    caplog.set_level("INFO", logger=size_sweeps.__name__)
    assert run(family([], a=16), blocked, fake_probe([])) == 16
    assert "not kept" in caplog.text and "the next start sweeps every size" in caplog.text


def test_the_cache_entry_holds_the_kernel_map(tmp_path: Path) -> None:
    env: dict[str, str] = {}
    apply_cache_env(tmp_path / "entry", env)
    assert CACHE_ENV_VARS[ENV_VAR] == "shape_sweeps"
    assert kernel_map_dir(env) == tmp_path / "entry" / "shape_sweeps"
    assert kernel_map_dir({}) is None
