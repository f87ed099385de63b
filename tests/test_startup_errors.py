"""Start-up configurations that can never serve: exit 2 at once, with one line on stderr
naming the flag (and, for a busy port, the address), never a traceback, before any bind."""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.certs import make_pki
from tests.text_helpers import write_tiny_model
from warmgate.server.config.presets import MODEL_PRESETS, PRESET_MAX_POSITIONS
from warmgate.server.config.runner_config import ConfigError, ModelConfig
from warmgate.server.config.server_config import FLAG_OPTIONS
from warmgate.server.startup import load_server_config

ROOT = Path(__file__).resolve().parents[1]
# Start-up errors come before the model loads; a slow, shared machine still answers in this.
EXIT_WITHIN_S = 60.0


def run_server(*flags: str, env: dict[str, str] | None = None
               ) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items()
            if not k.startswith("WARMGATE_") and k != "TRITON_INTERPRET"}
    return subprocess.run(
        [sys.executable, "-m", "warmgate.server.main", "--host", "127.0.0.1", "--port", "0",
         "--device", "cpu", *flags],
        env={**base, "PYTHONPATH": os.pathsep.join([str(ROOT / "client"), str(ROOT / "server")]),
             "WARMGATE_METRICS_PORT": "-1", **(env or {})},
        capture_output=True, text=True, timeout=EXIT_WITHIN_S, check=False)


def assert_one_line_exit_2(result: subprocess.CompletedProcess[str], *needles: str) -> str:
    err = result.stderr
    assert result.returncode == 2, err
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    for needle in needles:
        assert needle in lines[0], err
    return lines[0]


@pytest.mark.parametrize(("flags", "env", "flag"), [
    (["--max-model-len", "1"], {}, "--max-model-len"),
    (["--max-model-len", "2"], {}, "--max-model-len"),
    # k=3: one warmup request is 5 prompt tokens and a 4-token decode; 8 cannot hold it.
    (["--max-model-len", "8", "--num-speculative-steps", "3"], {}, "--max-model-len"),
    (["--attention-backend", "bogus"], {}, "--attention-backend"),
    (["--attention-backend", "triton"], {}, "--attention-backend"),
    (["--attention-backend", "flashinfer"], {}, "--attention-backend"),
    (["--shutdown-grace", "nan"], {}, "--shutdown-grace"),
    (["--shutdown-grace", "inf"], {}, "--shutdown-grace"),
    (["--cache-lock-timeout", "NaN"], {}, "--cache-lock-timeout"),
    (["--cache-lock-timeout", "-inf"], {}, "--cache-lock-timeout"),
    ([], {"WARMGATE_CACHE_LOCK_TIMEOUT": "nan"}, "--cache-lock-timeout"),
], ids=["len1", "len2", "len8-k3", "bogus-backend", "triton-cpu", "flashinfer-cpu",
        "grace-nan", "grace-inf", "lock-nan", "lock-neg-inf", "lock-nan-env"])
def test_never_serving_configs_exit_2_naming_the_flag(flags: list[str], env: dict[str, str],
                                                      flag: str) -> None:
    assert_one_line_exit_2(run_server(*flags, env=env), f"argument {flag}:")


@pytest.mark.parametrize(("flags", "env"), [
    (["--tensor-parallel-size", "2", "--compile"], {}),
    (["--compile"], {"WARMGATE_TENSOR_PARALLEL_SIZE": "2"}),
    (["--tensor-parallel-size", "2"], {"WARMGATE_COMPILE": "1"}),
], ids=["flags", "tp-env", "compile-env"])
def test_compile_at_tensor_parallel_exits_2_naming_the_flag(flags: list[str],
                                                            env: dict[str, str]) -> None:
    """Issue 23: torch.compile of the sharded layers (an all-reduce inside a compiled graph,
    on every rank) is not supported; the server refuses it before anything starts."""
    assert_one_line_exit_2(run_server(*flags, env=env), "argument --tensor-parallel-size:",
                           "with --compile", "turn --compile off")


def test_every_float_flag_refuses_nan_and_inf() -> None:
    """Whatever float flag is added later: none may hand NaN or inf to the server."""
    for opt in FLAG_OPTIONS:
        for text in ("nan", "inf", "-inf"):
            try:
                value = opt.parse(text)
            except ValueError:
                continue
            assert not (isinstance(value, float) and not math.isfinite(value)), opt.flag


def test_smallest_model_len_the_warmup_needs_is_accepted() -> None:
    # The plan caps its steps at the context, so one request (2 + 1 tokens at k=0) is enough.
    cfg = load_server_config(["--device", "cpu", "--max-model-len", "3"], environ={})
    assert cfg.runner.model.max_model_len == 3


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A port some other process listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


@pytest.mark.parametrize("flag", ["--port", "--health-port", "--metrics-port"])
def test_busy_port_exits_at_once_naming_flag_and_address(flag: str, busy_port: int) -> None:
    start = time.monotonic()
    result = run_server(flag, str(busy_port))
    line = assert_one_line_exit_2(result, f"argument {flag}:", f"127.0.0.1:{busy_port}")
    assert "in use" in line, line
    assert time.monotonic() - start < EXIT_WITHIN_S


def test_two_flags_on_one_port_exit_2(busy_port: int) -> None:
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    assert_one_line_exit_2(run_server("--port", str(port), "--health-port", str(port)),
                           "argument --health-port:", "--port")


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    return make_pki(tmp_path_factory.mktemp("pki"))


def test_tls_key_of_another_certificate_exits_2(pki) -> None:  # type: ignore[no-untyped-def]
    assert_one_line_exit_2(run_server("--tls-cert", str(pki.server_cert),
                                      "--tls-key", str(pki.client_key)),
                           "argument --tls-key:", "not the private key")


def test_swapped_cert_and_key_exit_2(pki) -> None:  # type: ignore[no-untyped-def]
    assert_one_line_exit_2(run_server("--tls-cert", str(pki.server_key),
                                      "--tls-key", str(pki.server_cert)),
                           "argument --tls-cert:", "swapped")


def test_garbage_pem_exits_2(pki, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydA==\n"
                       "-----END CERTIFICATE-----\n")
    assert_one_line_exit_2(run_server("--tls-cert", str(garbage),
                                      "--tls-key", str(pki.server_key)),
                           "argument --tls-cert:", "not a valid PEM")
    assert_one_line_exit_2(run_server("--tls-cert", str(pki.server_cert), "--tls-key",
                                      str(pki.server_cert), "--tls-client-ca", str(garbage)),
                           "argument --tls-key:")
    assert_one_line_exit_2(run_server("--tls-cert", str(pki.server_cert), "--tls-key",
                                      str(pki.server_key), "--tls-client-ca", str(garbage)),
                           "argument --tls-client-ca:", "not a valid PEM")


def test_model_config_json_that_is_not_json_exits_2(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{"vocab_size": 512,')
    assert_one_line_exit_2(run_server("--model", str(tmp_path)), "argument --model:",
                           "config.json")


def test_max_model_len_past_the_models_positions_exits_2(tmp_path: Path) -> None:
    """The load refuses a --max-model-len beyond the checkpoint's max_position_embeddings, so
    start-up must too: it was a server that stayed NOT_SERVING (warmup-only: exit 1)."""
    write_tiny_model(tmp_path)
    limit = json.loads((tmp_path / "config.json").read_text())["max_position_embeddings"]
    assert_one_line_exit_2(run_server("--model", str(tmp_path), "--max-model-len",
                                      str(limit + 1)),
                           "argument --max-model-len:", "max_position_embeddings")
    assert_one_line_exit_2(run_server("--model", str(tmp_path), "--max-model-len",
                                      str(limit + 1), "--warmup-only"),
                           "argument --max-model-len:")


def test_max_model_len_past_a_presets_positions_exits_2() -> None:
    """A preset is checked as a directory is: past tiny's positions the rope cache and the
    automatic KV cache grew with the flag, and the load ground on for minutes."""
    assert_one_line_exit_2(run_server("--model", "tiny", "--max-model-len", "99999999",
                                      "--warmup-only"),
                           "argument --max-model-len:", "tiny's max_position_embeddings 32768")


def test_every_preset_takes_lengths_up_to_its_positions_and_no_further() -> None:
    for name in MODEL_PRESETS:
        model = ModelConfig.from_preset(name)
        assert model.max_model_len <= PRESET_MAX_POSITIONS[name], name
        assert ModelConfig.from_preset(name, max_model_len=PRESET_MAX_POSITIONS[name])
        with pytest.raises(ConfigError, match="max_position_embeddings"):
            ModelConfig.from_preset(name, max_model_len=PRESET_MAX_POSITIONS[name] + 1)


# A port taken between main's check and gRPC's bind: the same one line (gRPC's C core may
# add its own log line; the last line is ours), exit 2, no traceback.
RACE = """
import socket, sys
import warmgate.server.main as main
stranger = socket.socket()
stranger.bind(("127.0.0.1", 0))
stranger.listen()
port = stranger.getsockname()[1]
real, calls = main.check_ports, []
def taken_after_the_first_check(host, ports):
    calls.append(1)
    if len(calls) > 1:
        real(host, ports)
main.check_ports = taken_after_the_first_check
sys.exit(main.main(["--host", "127.0.0.1", "--port", str(port), "--device", "cpu",
                    "--metrics-port", "-1"]))
"""


def test_port_taken_after_the_check_still_exits_2_with_one_line() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WARMGATE_")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "client"), str(ROOT / "server")])
    result = subprocess.run([sys.executable, "-c", RACE], env=env, capture_output=True,
                            text=True, timeout=EXIT_WITHIN_S, check=False)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("warmgate-server: error: argument --port: cannot bind 127.0.0.1:")


def test_an_unusable_chat_template_is_one_line_naming_the_file(tmp_path: Path) -> None:
    write_tiny_model(tmp_path)
    (tmp_path / "chat_template.jinja").write_text("{% if %}")
    assert_one_line_exit_2(run_server("--model", str(tmp_path)), "argument --model:",
                           "chat_template.jinja")
