"""The sampler rows' kernel map (size_sweeps.py, as for the GEMMs): one sweep per sampling
variant (and verifier, and logprobs gather), learned once in a file of its own, its sizes run
through the real sampler on a warm start, and not trusted once a variant's parameters change."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from tests.runner_helpers import make_runner
from tests.test_shape_sweep_kernel_map import _no_probe, fake_probe
from warmgate.server.cache.shape_sweeps import SAMPLER_FILE
from warmgate.server.runner.scheduler_output import GREEDY
from warmgate.server.warmup import sampler_rows
from warmgate.server.warmup.sampler_rows import VARIANTS, sampler_sweeps, sweep_sampler_rows


def _count_rows(monkeypatch: pytest.MonkeyPatch, runner: Any) -> list[tuple[str, int]]:
    """(method, rows) of every sample() and verify() the sweep makes."""
    seen: list[tuple[str, int]] = []
    for name in ("sample", "verify"):
        real = getattr(runner.sampler, name)

        def counting(logits: Any, *args: Any, _real: Any = real, _name: str = name,
                     **kwargs: Any) -> Any:
            seen.append((_name, len(args[1] if _name == "verify" else args[0])))
            return _real(logits, *args, **kwargs)
        monkeypatch.setattr(runner.sampler, name, counting)
    return seen


def test_learned_once_then_only_the_kept_sizes_run(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    runner = make_runner(num_spec=2, max_num_seqs=16)
    sweeps = sampler_sweeps(runner)
    assert len({s.key for s in sweeps}) == len(sweeps) == 2 * len(VARIANTS) + 2
    full = sum(s.max_size for s in sweeps)
    probed: list[tuple[str, int]] = []
    assert sweep_sampler_rows(runner, kernel_dir=tmp_path, probe=fake_probe(probed)) == full
    assert probed == [(s.key, s.max_size) for s in sweeps]
    assert [p.name for p in tmp_path.iterdir()] == [SAMPLER_FILE]
    kept = json.loads((tmp_path / SAMPLER_FILE).read_text())["sizes"]
    # The fake's kernels change at 9 and 64: 16 requests keep 1, 9 and the largest, 16; the
    # 48 logits rows of the gather 1, 9 and 48.
    assert {k: v for k, v in kept.items() if not k.startswith("logprobs")} == {
        s.key: [1, 9, 16] for s in sweeps if not s.key.startswith("logprobs")}
    assert [v for k, v in kept.items() if k.startswith("logprobs")] == [[1, 9, 48]] * 2
    rows = _count_rows(monkeypatch, runner)
    assert sweep_sampler_rows(runner, kernel_dir=tmp_path, probe=_no_probe) == 3 * len(sweeps)
    assert rows == [("sample", n) for _ in VARIANTS for n in (1, 9, 16)] + [
        ("verify", n) for _ in VARIANTS for n in (1, 9, 16)]


def test_a_changed_variant_is_learned_again(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    runner = make_runner(max_num_seqs=8)
    sweep_sampler_rows(runner, kernel_dir=tmp_path, probe=fake_probe([]))
    changed = (*VARIANTS[:-1], (dataclasses.replace(GREEDY, logit_bias=((3, 2.0),)),))
    monkeypatch.setattr(sampler_rows, "VARIANTS", changed)
    probed: list[tuple[str, int]] = []
    full = sum(s.max_size for s in sampler_sweeps(runner))
    assert sweep_sampler_rows(runner, kernel_dir=tmp_path, probe=fake_probe(probed)) == full
    assert probed, "a map learned for other parameters must not be trusted"


def test_without_a_cache_every_batch_size_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    runner = make_runner(max_num_seqs=4)
    rows = _count_rows(monkeypatch, runner)
    assert sweep_sampler_rows(runner, probe=_no_probe) == len(VARIANTS) * 4 + 4 * 2
    assert rows == [("sample", n) for _ in VARIANTS for n in range(1, 5)]
