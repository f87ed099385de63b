"""Units under the hardening: fatal-error classification, fault specs, tokens, TLS config."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.certs import make_pki
from warmgate.server.api.auth import is_open, presented_token, token_matches
from warmgate.server.config.faults import Fault, parse_faults
from warmgate.server.control.faults import FaultInjector
from warmgate.server.core.failures import (
    FatalDeviceError,
    describe_failure,
    is_compile_error,
    is_fatal_device_error,
    is_out_of_memory,
)
from warmgate.server.core.progress import ProgressEvent
from warmgate.server.startup import load_server_config

ILLEGAL = "CUDA error: an illegal memory access was encountered"


@pytest.mark.parametrize("exc", [
    RuntimeError(ILLEGAL),
    RuntimeError("CUDA error: device-side assert triggered\nCompile with TORCH_USE_CUDA_DSA"),
    RuntimeError("Triton Error [CUDA]: unspecified launch failure"),
    FatalDeviceError("kernels.decode", RuntimeError(ILLEGAL)),
])
def test_sticky_cuda_errors_are_fatal(exc: BaseException) -> None:
    assert is_fatal_device_error(exc)
    assert "exits with code 70" in describe_failure("kernels.decode", exc)


@pytest.mark.parametrize("exc", [
    torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
    RuntimeError("CUDA driver initialization failed"),  # a setup error, not a lost context
    ValueError("an illegal memory access was encountered"),  # no CUDA in it: not the device's
    RuntimeError("shape mismatch"),
])
def test_recoverable_errors_are_not_fatal(exc: BaseException) -> None:
    assert not is_fatal_device_error(exc)


def test_a_chained_fatal_error_is_found() -> None:
    try:
        try:
            raise RuntimeError(ILLEGAL)
        except RuntimeError as inner:
            raise KeyError("wrapper") from inner
    except KeyError as outer:
        assert is_fatal_device_error(outer)


def test_fault_spec_parses_and_rejects_with_reasons() -> None:
    assert parse_faults("") == ()
    assert parse_faults("kernels.decode:oom, mixed:delay=1.5,load:cuda_fatal") == (
        Fault("kernels.decode", "oom"), Fault("mixed", "delay", 1.5),
        Fault("load", "cuda_fatal"))
    for bad, fragment in (("cuda_graphs:oom", "phase one of"), ("kernels.decode", "phase:kind"),
                          ("mixed:segfault", "kind must be"), ("mixed:delay=-1", "delay must")):
        with pytest.raises(ValueError, match=fragment):
            parse_faults(bad)


def test_injected_faults_look_like_the_real_errors() -> None:
    assert is_out_of_memory(Fault("mixed", "oom").exception())
    assert is_compile_error(Fault("mixed", "compile").exception())
    assert is_fatal_device_error(Fault("mixed", "cuda_fatal").exception())


def test_injector_fires_in_the_phase_that_is_running_once() -> None:
    injector = FaultInjector([Fault("kernels.decode", "oom")])
    calls: list[str] = []

    class Runner:
        def execute_model(self, scheduler_output: object) -> str:
            calls.append("execute")
            return "out"

        def sample_tokens(self, grammar_output: object) -> str:
            return "tokens"

    runner = Runner()
    injector.wrap_runner(runner)
    events: list[ProgressEvent] = []
    progress = injector.watching(events.append)
    for _ in range(2):  # the second run finds the fault spent
        injector.start_run()
        assert runner.execute_model(None) == "out"  # prefill: no fault
        progress(ProgressEvent("kernels.prefill", 1, 1))
        if not injector.fired:
            with pytest.raises(torch.OutOfMemoryError):
                runner.execute_model(None)  # the decode phase's first call
        else:
            runner.execute_model(None)
    assert [f.phase for f in injector.fired] == ["kernels.decode"]
    assert len(events) == 2 and calls == ["execute"] * 3


def test_bearer_token_parsing_and_constant_time_match() -> None:
    accepted = (b"alpha-token", b"beta-token")
    assert presented_token([("authorization", "Bearer alpha-token")]) == b"alpha-token"
    assert presented_token([("x-other", "1"), ("authorization", "bearer  beta-token ")]) == \
        b"beta-token"
    for metadata in (None, [], [("authorization", "Basic alpha-token")],
                     [("authorization", "Bearer")], [("authorization", "")]):
        assert presented_token(metadata) is None
    assert token_matches(b"beta-token", accepted)
    assert not token_matches(b"alpha-toke", accepted) and not token_matches(None, accepted)
    assert is_open("/grpc.health.v1.Health/Check") and is_open("/warmgate.v1.Warmup/GetStatus")
    assert not is_open("/warmgate.v1.Warmup/WarmupKernels")
    assert not is_open("/warmgate.v1.Warmup/Generate")  # deny by default


def _exit_message(argv: list[str], capsys: pytest.CaptureFixture[str],
                  environ: dict[str, str] | None = None) -> str:
    with pytest.raises(SystemExit) as info:
        load_server_config(["--device", "cpu", *argv], environ or {})
    assert info.value.code == 2
    return capsys.readouterr().err


def test_security_flags_fail_at_start_naming_the_flag(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pki = make_pki(tmp_path)
    empty, spaced, not_pem = tmp_path / "empty", tmp_path / "spaced", tmp_path / "not.pem"
    empty.write_text("\n\n")
    spaced.write_text("two words\n")
    not_pem.write_text("hello")
    cert, key = str(pki.server_cert), str(pki.server_key)
    for argv, fragment in (
            (["--tls-cert", cert], "argument --tls-key"),
            (["--tls-key", key], "argument --tls-cert"),
            (["--tls-client-ca", str(pki.ca)], "argument --tls-client-ca"),
            (["--tls-cert", cert, "--tls-key", str(tmp_path / "nope")], "cannot read"),
            (["--tls-cert", str(not_pem), "--tls-key", key], "is not PEM"),
            (["--auth-token-file", str(empty)], "is empty"),
            (["--auth-token-file", str(spaced)], "printable ASCII"),
            (["--health-port", "-5"], "argument --health-port")):
        assert fragment in _exit_message(argv, capsys), argv
    assert "WARMGATE_FAULT_INJECT" in _exit_message(
        [], capsys, {"WARMGATE_FAULT_INJECT": "mixed:segfault"})


def test_secrets_stay_out_of_the_config_repr(tmp_path: Path) -> None:
    pki = make_pki(tmp_path)
    tokens = tmp_path / "tokens"
    tokens.write_text("very-secret-token\n")
    config = load_server_config(
        ["--device", "cpu", "--tls-cert", str(pki.server_cert), "--tls-key",
         str(pki.server_key), "--auth-token-file", str(tokens), "--health-port", "0"],
        {"WARMGATE_FAULT_INJECT": "mixed:oom"})
    assert config.security.tls and config.security.auth and config.health_port == 0
    assert config.faults == (Fault("mixed", "oom"),)
    text = repr(config)
    assert "very-secret-token" not in text and "PRIVATE KEY" not in text
    from_env = load_server_config(["--device", "cpu"], {
        "WARMGATE_AUTH_TOKEN_FILE": str(tokens), "WARMGATE_HEALTH_PORT": "8081"})
    assert from_env.security.auth_tokens == (b"very-secret-token",)
    assert from_env.health_port == 8081
    # Nothing is on by default.
    plain = load_server_config(["--device", "cpu"], {})
    assert not plain.security.tls and not plain.security.auth
    assert not plain.health_port_enabled and plain.faults == ()
