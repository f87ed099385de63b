"""Start-up checks in-process: warmup.shapes.check_config_capacity refuses a context exactly
when the warmup plan itself would fail on it (so the server never binds a port for a
configuration that can never be ready, and never refuses one that can), and a backend whose
package is missing, or that has no kernel for the model's head size, is refused."""

from __future__ import annotations

import dataclasses

import pytest

from tests.runner_helpers import tiny_config
from warmgate.server.config.runner_config import (
    ConfigError,
    DeviceConfig,
    resolve_runner_config,
)
from warmgate.server.config.startup_checks import check_attention_backend
from warmgate.server.runner.attention import backend_available
from warmgate.server.warmup.plan import load_runner, run_warmup_plan
from warmgate.server.warmup.shapes import check_config_capacity


@pytest.mark.parametrize(("num_spec", "max_num_seqs", "mixed"),
                         [(0, 8, None), (1, 8, None), (3, 8, 4), (0, 1, None)])
def test_the_start_up_check_agrees_with_the_plan(num_spec: int, max_num_seqs: int,
                                                 mixed: int | None) -> None:
    for length in (1, 2, 3, 5, 16):
        config = tiny_config(num_spec=num_spec, max_num_seqs=max_num_seqs,
                             max_model_len=length)
        try:
            check_config_capacity(config, mixed)
            refused = None
        except ConfigError as exc:
            refused = exc
        runner, load = load_runner(config)
        report = run_warmup_plan(runner, load_phase=load, mixed_num_tokens=mixed)
        assert report.succeeded is (refused is None), (length, refused, report.to_dict())
        if refused is not None:
            assert refused.field_name in ("model.max_model_len", "--mixed-num-tokens",
                                          "cache.num_blocks")


def test_a_backend_whose_package_is_missing_is_refused() -> None:
    if backend_available("flashinfer"):
        pytest.skip("flashinfer is installed here")
    config = tiny_config(head_dim=64)  # a head size FlashInfer has kernels for
    on_cuda = dataclasses.replace(config, device=DeviceConfig(
        device="cuda", dtype="bfloat16", attention_backend="flashinfer"))
    with pytest.raises(ConfigError) as info:
        check_attention_backend(on_cuda, {})
    assert info.value.field_name == "device.attention_backend"
    assert "not installed" in info.value.message


def test_flashinfer_is_refused_for_a_head_size_it_has_no_kernels_for() -> None:
    on_cuda = dataclasses.replace(tiny_config(), device=DeviceConfig(
        device="cuda", dtype="bfloat16", attention_backend="flashinfer"))
    with pytest.raises(ConfigError) as info:
        check_attention_backend(on_cuda, {})
    assert info.value.field_name == "device.attention_backend"
    assert info.value.message == ("flashinfer supports head sizes 64, 128, 256; this model's is "
                                  "16: use --attention-backend triton (or auto)")


@pytest.mark.parametrize(("head_dim", "backend"), [(16, "triton"), (64, "flashinfer")])
def test_auto_picks_flashinfer_only_for_a_head_size_it_has_kernels_for(head_dim: int,
                                                                      backend: str) -> None:
    config = tiny_config(head_dim=head_dim)
    auto = dataclasses.replace(config, device=DeviceConfig(device="cuda"),
                               cache=dataclasses.replace(config.cache, num_blocks=None))
    resolved = resolve_runner_config(auto, cuda_available=True, flashinfer_available=True,
                                     triton_available=True, cuda_capability=(9, 0))
    assert resolved.device.attention_backend == backend


def test_triton_on_cpu_is_allowed_in_the_interpreter_only() -> None:
    config = dataclasses.replace(tiny_config(), device=DeviceConfig(
        device="cpu", dtype="float32", attention_backend="triton"))
    if not backend_available("triton"):
        pytest.skip("triton is not installed")
    check_attention_backend(config, {"TRITON_INTERPRET": "1"})
    with pytest.raises(ConfigError):
        check_attention_backend(config, {})
