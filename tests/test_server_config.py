"""load_server_config: flag beats WARMGATE_ env beats default; bad values name their flag."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from warmgate.server.config.flags import Option
from warmgate.server.config.runner_config import (
    CacheConfig,
    CompilationConfig,
    ConfigError,
    DeviceConfig,
    ModelConfig,
    SchedulerConfig,
    SpeculativeConfig,
)
from warmgate.server.config.server_config import (
    FLAG_OPTIONS,
    METRICS_DISABLED,
    RUNNER_FLAGS,
    ServerConfig,
    build_parser,
    report_config_error,
)
from warmgate.server.config.serving_config import ServingConfig
from warmgate.server.startup import load_server_config


def cfg(argv: list[str], env: dict[str, str] | None = None) -> ServerConfig:
    return load_server_config(["--device", "cpu", *argv], env or {})


def test_defaults() -> None:
    c = cfg([])
    assert (c.host, c.port, c.metrics_port, c.warmup_on_start) == ("0.0.0.0", 50051, 9464, True)
    assert c.mixed_num_tokens is None and c.log_level == "INFO"
    assert c.runner.model.name == "tiny" and c.runner.is_resolved
    assert c.runner.device.attention_backend == "torch"


def test_flag_beats_env_beats_default() -> None:
    env = {"WARMGATE_PORT": "6000", "WARMGATE_MAX_NUM_SEQS": "4",
           "WARMGATE_WARMUP_ON_START": "false", "WARMGATE_METRICS_PORT": "-1"}
    c = cfg(["--port", "7000"], env)
    assert c.port == 7000  # the flag
    assert c.runner.scheduler.max_num_seqs == 4  # the environment
    assert c.warmup_on_start is False and not c.metrics_enabled
    assert c.metrics_port == METRICS_DISABLED
    assert cfg(["--warmup-on-start"], env).warmup_on_start is True


def test_runner_flags_reach_the_runner_config() -> None:
    c = cfg(["--num-speculative-steps", "2", "--max-num-batched-tokens", "128",
             "--num-blocks", "64", "--block-size", "8", "--dtype", "float32",
             "--attention-backend", "torch", "--mixed-num-tokens", "32", "--max-model-len",
             "256", "--no-cuda-graphs", "--no-ragged-cuda-graphs"])
    r = c.runner
    assert not r.compilation.ragged_cuda_graphs
    assert r.speculative.num_speculative_steps == 2 and r.decode_query_len == 3
    assert (r.scheduler.max_num_batched_tokens, r.cache.num_blocks, r.cache.block_size) == \
        (128, 64, 8)
    assert r.model.max_model_len == 256 and not r.compilation.enable_cuda_graphs
    assert c.mixed_num_tokens == 32


@pytest.mark.parametrize(("argv", "env", "flag"), [
    (["--port", "70000"], {}, "--port"),
    (["--port", "x"], {}, "--port"),
    ([], {"WARMGATE_PORT": "nope"}, "--port"),
    (["--max-num-seqs", "0"], {}, "--max-num-seqs"),
    (["--block-size", "0"], {}, "--block-size"),
    (["--dtype", "int8"], {}, "--dtype"),
    (["--model", "no-such-model"], {}, "--model"),
    (["--mixed-num-tokens", "-1"], {}, "--mixed-num-tokens"),
    (["--mixed-num-tokens", "100000"], {}, "--mixed-num-tokens"),
    (["--metrics-port", "-2"], {}, "--metrics-port"),
    (["--log-level", "chatty"], {}, "--log-level"),
    ([], {"WARMGATE_WARMUP_ON_START": "maybe"}, "--warmup-on-start"),
    (["--grammar-compile-timeout", "0"], {}, "--grammar-compile-timeout"),
    ([], {"WARMGATE_GRAMMAR_MAX_COMPILES": "0"}, "--grammar-max-compiles"),
    (["--grammar-cache-mib", "-1"], {}, "--grammar-cache-mib"),
])
def test_bad_values_exit_naming_the_flag(argv: list[str], env: dict[str, str], flag: str,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        cfg(argv, env)
    assert info.value.code == 2
    assert f"argument {flag}:" in capsys.readouterr().err


def test_cuda_without_cuda_names_the_device_flag(capsys: pytest.CaptureFixture[str]) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(SystemExit):
        load_server_config(["--device", "cuda"], {})
    assert "argument --device:" in capsys.readouterr().err


def _write_zero_weights(directory: Path) -> None:
    import torch
    from safetensors.torch import save_file

    from warmgate.server.config.hf_config import model_config_from_hf
    from warmgate.server.config.weight_files import expected_tensor_shapes

    shapes = expected_tensor_shapes(model_config_from_hf(directory))
    save_file({name: torch.zeros(shape) for name, shape in shapes.items()},
              str(directory / "model.safetensors"))


def test_model_may_be_a_local_hf_directory(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "config.json").write_text(
        '{"architectures": ["LlamaForCausalLM"], "vocab_size": 256, "hidden_size": 32,'
        ' "num_hidden_layers": 1,'
        ' "num_attention_heads": 2, "intermediate_size": 64, "max_position_embeddings": 128}')
    with pytest.raises(SystemExit):  # start-up reads the weight files' headers too
        cfg(["--model", str(tmp_path)])
    assert "*.safetensors: no weight files" in capsys.readouterr().err
    _write_zero_weights(tmp_path)
    c = cfg(["--model", str(tmp_path)])
    assert c.runner.model.weights_path == str(tmp_path) and c.runner.model.hidden_size == 32
    with pytest.raises(SystemExit):
        cfg(["--model", str(tmp_path / "missing")])
    assert "argument --model:" in capsys.readouterr().err


# -- each flag, its environment variable and its default said once ------------------------

def test_every_flag_defaults_to_its_field_default() -> None:
    """No restated default: an unset flag leaves each field at its dataclass default."""
    c = load_server_config([], {}, resolve=False)
    assert c.runner.cache == CacheConfig() and c.runner.scheduler == SchedulerConfig()
    assert c.runner.speculative == SpeculativeConfig() and c.runner.device == DeviceConfig()
    assert c.runner.compilation == CompilationConfig() and c.serving == ServingConfig()
    assert c.runner.model == ModelConfig.from_preset(ModelConfig().name)
    for f in dataclasses.fields(ServerConfig):
        if f.default is not dataclasses.MISSING:
            assert getattr(c, f.name) == f.default, f.name


def test_environment_names_and_help_come_from_the_flag() -> None:
    flags = [o.flag for o in FLAG_OPTIONS]
    assert len(flags) == len(set(flags)) and len(flags) >= 30
    parser = build_parser({})
    helps = {a.option_strings[0]: a.help for a in parser._actions if a.option_strings}
    for o in FLAG_OPTIONS:
        assert o.env == "WARMGATE_" + o.flag.removeprefix("--").replace("-", "_").upper()
        assert helps[o.flag].endswith(f"(env {o.env}; default {o.default})"), o.flag
    assert set(RUNNER_FLAGS) == {o.flag for o in FLAG_OPTIONS
                                 if o.path.startswith("runner.")}
    assert {"--model", "--max-num-seqs", "--attention-backend", "--compile"} <= \
        set(RUNNER_FLAGS) and "--port" not in RUNNER_FLAGS


@pytest.mark.parametrize("option", FLAG_OPTIONS, ids=lambda o: o.flag)
def test_a_config_error_about_a_field_names_its_flag(
        option: Option, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        report_config_error(build_parser({}), ConfigError(option.error_field, "bad"))
    assert f"argument {option.flag}: bad" in capsys.readouterr().err


def test_the_parser_is_built_once_per_set_of_environment_defaults() -> None:
    from warmgate.server.config.server_config import build_parser

    base = {"WARMGATE_PORT": "6000", "HOME": "/root"}
    parser = build_parser(base)
    # Only WARMGATE_ values shape it: another unrelated variable gets the same parser ...
    assert build_parser({**base, "HOME": "/tmp", "PATH": "/bin"}) is parser
    assert parser.parse_args([]).port == 6000 and parser.parse_args(["--port", "7"]).port == 7
    assert build_parser(base).parse_args([]).port == 6000  # parsing changed nothing
    # ... and another WARMGATE_ value its own, with its own default.
    other = build_parser({**base, "WARMGATE_PORT": "6001"})
    assert other is not parser and other.parse_args([]).port == 6001
