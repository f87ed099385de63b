"""A model directory that claims more than it holds (a safetensors header with F64 over
F32-sized data, a max_position_embeddings of 1e12 or 2e7) fails the start-up: exit 2 with one
line, in a process that never grows past 512 MiB, rather than staying up in state FAILED
after an attempted multi-gigabyte allocation."""

from __future__ import annotations

import dataclasses
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.runner_helpers import save_tiny, tiny_config
from warmgate.server.config.hf_config import (
    MAX_POSITIONS_LIMIT,
    ModelLoadError,
    model_config_from_hf,
)
from warmgate.server.config.rope_config import RopeConfig
from warmgate.server.config.runner_config import (
    ConfigError,
    DeviceConfig,
    RunnerConfig,
    resolve_runner_config,
)
from warmgate.server.config.safetensors_header import read_header
from warmgate.server.config.startup_checks import check_host_memory, length_sized_bytes
from warmgate.server.host_memory import host_available_bytes
from warmgate.server.runner.rope import cos_sin_cache, rope_frequencies

ROOT = Path(__file__).resolve().parents[1]
RSS_LIMIT_BYTES = 512 * 2**20


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny(tmp_path_factory.mktemp("tiny"))


def _copy(saved: Path, target: Path) -> Path:
    target.mkdir()
    for name in ("config.json", "model.safetensors"):
        (target / name).write_bytes((saved / name).read_bytes())
    return target


def _set_positions(directory: Path, raw: str) -> None:
    """max_position_embeddings written as the JSON text `raw` (1e12 is a float in JSON)."""
    text = (directory / "config.json").read_text()
    config = json.loads(text)
    config["max_position_embeddings"] = "@@"
    (directory / "config.json").write_text(json.dumps(config).replace('"@@"', raw))


def _claim_f64(directory: Path, name: str) -> None:
    """The header says F64 for an F32 tensor; its data_offsets still span F32 bytes."""
    path = directory / "model.safetensors"
    data = path.read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + length])
    assert header[name]["dtype"] == "F32"
    header[name]["dtype"] = "F64"
    text = json.dumps(header, separators=(",", ":")).encode()
    assert len(text) <= length
    path.write_bytes(data[:8] + text.ljust(length) + data[8 + length:])


# Runs the server and prints its peak RSS. A small process of its own starts it: a child's
# ru_maxrss counts the memory of the process it was forked from until it execs, which for
# pytest (torch, transformers loaded) alone would be hundreds of MiB.
# (A server that does not exit in time is killed by this parent, not left behind.)
_MEASURE = ("import resource, subprocess, sys\n"
            "p = subprocess.Popen(sys.argv[1:])\n"
            "try:\n    code = p.wait(timeout=60)\n"
            "except subprocess.TimeoutExpired:\n    p.terminate()\n    code = p.wait()\n"
            "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
            "sys.exit(code)")


def _run(directory: Path) -> tuple[int, str, int]:
    """(exit code, stderr, peak RSS in bytes) of a server started on `directory`."""
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("WARMGATE_")},
           "PYTHONPATH": os.pathsep.join([str(ROOT / "client"), str(ROOT / "server")]),
           "WARMGATE_METRICS_PORT": "-1"}
    proc = subprocess.run(
        [sys.executable, "-c", _MEASURE, sys.executable, "-m", "warmgate.server.main",
         "--host", "127.0.0.1", "--port", "0", "--device", "cpu", "--model", str(directory)],
        env=env, capture_output=True, text=True, timeout=120, check=False)
    # ru_maxrss is in KiB on Linux.
    return proc.returncode, proc.stderr, int(proc.stdout.strip().splitlines()[-1]) * 1024


def _assert_one_line_exit_2(code: int, err: str, rss: int, *needles: str) -> None:
    assert code == 2, err
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    for needle in needles:
        assert needle in lines[0], err
    assert 0 < rss < RSS_LIMIT_BYTES, f"peak RSS {rss / 2**20:.0f} MiB"


def test_an_f64_header_over_f32_data_is_refused_by_the_header_check(saved: Path,
                                                                    tmp_path: Path) -> None:
    directory = _copy(saved, tmp_path / "m")
    _claim_f64(directory, "model.norm.weight")
    with pytest.raises(ModelLoadError, match=r"model\.norm\.weight: holds 256 bytes, its "
                                             r"dtype F64 and shape \[64\] need 512"):
        read_header(directory / "model.safetensors")


@pytest.mark.slow
def test_server_exits_2_on_an_f64_header_over_f32_data(saved: Path, tmp_path: Path) -> None:
    directory = _copy(saved, tmp_path / "m")
    _claim_f64(directory, "model.layers.0.mlp.up_proj.weight")
    _assert_one_line_exit_2(*_run(directory), "model.safetensors",
                            "model.layers.0.mlp.up_proj.weight", "F64")


@pytest.mark.slow
@pytest.mark.parametrize("raw", ["1000000000000", "1e12", "20000000", "2e7"])
def test_server_exits_2_on_absurd_max_position_embeddings(raw: str, saved: Path,
                                                          tmp_path: Path) -> None:
    directory = _copy(saved, tmp_path / "m")
    _set_positions(directory, raw)
    _assert_one_line_exit_2(*_run(directory), "config.json: max_position_embeddings: ")


@pytest.mark.slow
def test_server_exits_2_when_the_length_outgrows_host_memory(saved: Path,
                                                             tmp_path: Path) -> None:
    """The largest length allowed: on a CPU, its rope, KV cache and block tables (64 GiB for
    the tiny model) must fit the host's memory, checked before torch is imported."""
    directory = _copy(saved, tmp_path / "m")
    _set_positions(directory, str(MAX_POSITIONS_LIMIT))
    runner = resolve_runner_config(RunnerConfig(
        model=model_config_from_hf(directory), device=DeviceConfig(device="cpu")),
        cuda_available=False)
    available = host_available_bytes()
    if available is None or sum(length_sized_bytes(runner).values()) <= available:
        pytest.skip("this host holds the caches of the longest allowed length")
    _assert_one_line_exit_2(*_run(directory), "argument --max-model-len:", "GiB available")


def test_host_memory_check_names_the_flag_that_sized_it() -> None:
    runner = tiny_config(max_model_len=4096, num_blocks=None, block_size=16)
    sizes = length_sized_bytes(runner)
    # tiny: 2 layers x (8 x 256 + 1) blocks x 2 x 16 x 2 heads x 16 x 4 bytes
    assert sizes["KV cache"] == 2 * (8 * 256 + 1) * 4096
    assert sizes["rope cache"] == 4096 * 16 * 4
    total = sum(sizes.values())
    check_host_memory(runner, total)
    check_host_memory(runner, None)  # unknown: the allocation's own check stays
    with pytest.raises(ConfigError) as info:
        check_host_memory(runner, total - 1)
    assert info.value.field_name == "model.max_model_len"
    explicit = dataclasses.replace(runner, cache=dataclasses.replace(runner.cache,
                                                                     num_blocks=100000))
    with pytest.raises(ConfigError) as info:
        check_host_memory(explicit, total)
    assert info.value.field_name == "cache.num_blocks"


@pytest.mark.parametrize("rope", [RopeConfig(theta=1000.0),
                                  RopeConfig(rope_type="yarn", factor=4.0,
                                             original_max_position_embeddings=64)])
def test_the_chunked_rope_cache_equals_the_whole_one_bit_for_bit(rope: RopeConfig) -> None:
    inv_freq, scale = rope_frequencies(rope, 16)
    freqs = torch.outer(torch.arange(1000, dtype=torch.float64), inv_freq.to(torch.float64))
    whole = (torch.cat([freqs.cos(), freqs.sin()], dim=-1) * scale).to(torch.float32)
    for chunk in (7, 256, 4096):
        assert torch.equal(cos_sin_cache(1000, 16, rope, chunk=chunk), whole), chunk
