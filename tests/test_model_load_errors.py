"""A model directory warmgate cannot serve as its reference would fails the load with one
ModelLoadError line naming the file and the key, and `warmgate-server` exits 2 on it."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.runner_helpers import copy_model_dir, save_tiny, tiny_config, with_model
from warmgate.server.config.hf_config import ModelLoadError, model_config_from_hf
from warmgate.server.runner.model_runner import ModelRunner

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny(tmp_path_factory.mktemp("tiny"))




CONFIG_EDITS: dict[str, tuple[Callable[[dict[str, Any]], None], str]] = {
    "architecture": (lambda c: c.update(architectures=["GemmaForCausalLM"]), "architectures"),
    "rope type": (lambda c: c["rope_parameters"].update(rope_type="dynamic", factor=2.0),
                  "rope_parameters.rope_type"),
    "4.x rope type": (lambda c: c.update(rope_theta=c.pop("rope_parameters")["rope_theta"],
                                         rope_scaling={"type": "longrope", "factor": 2.0}),
                      "rope_scaling.rope_type"),
    "llama3 without its band": (
        lambda c: c["rope_parameters"].update(rope_type="llama3", factor=8.0),
        "rope_parameters.low_freq_factor"),
    "per-layer rope": (lambda c: c.update(rope_parameters={"full_attention": {}}),
                       "rope_parameters"),
    "partial rotary": (lambda c: c["rope_parameters"].update(partial_rotary_factor=0.5),
                       "rope_parameters.partial_rotary_factor"),
    "quantized": (lambda c: c.update(quantization_config={"quant_method": "awq"}),
                  "quantization_config.quant_method"),
    "activation": (lambda c: c.update(hidden_act="gelu"), "hidden_act"),
    "llama attention bias": (lambda c: c.update(attention_bias=True), "attention_bias"),
    "llama mlp bias": (lambda c: c.update(mlp_bias=True), "mlp_bias"),
    # MistralConfig's default window (4096) applies when config.json has no sliding_window.
    "mistral window": (lambda c: (c.update(architectures=["MistralForCausalLM"],
                                           model_type="mistral", max_position_embeddings=8192),
                                  c.pop("sliding_window")), "sliding_window"),
    "qwen window": (lambda c: c.update(architectures=["Qwen2ForCausalLM"], model_type="qwen2",
                                       use_sliding_window=True, sliding_window=100,
                                       max_window_layers=1), "sliding_window"),
    "missing size": (lambda c: c.pop("hidden_size"), "hidden_size"),
    "bad value": (lambda c: c.update(num_key_value_heads=3), "num_key_value_heads"),
    # Wrong JSON types: one line naming the key, not a TypeError traceback (or "no" read as
    # true).
    "size as a string": (lambda c: c.update(vocab_size="512"), "vocab_size"),
    "layers as a float": (lambda c: c.update(num_hidden_layers=2.0), "num_hidden_layers"),
    "positions as a string": (lambda c: c.update(max_position_embeddings="x"),
                              "max_position_embeddings"),
    "head_dim as a bool": (lambda c: c.update(head_dim=True), "head_dim"),
    "eps as a string": (lambda c: c.update(rms_norm_eps="1e-5"), "rms_norm_eps"),
    "tie as a string": (lambda c: c.update(tie_word_embeddings="no"), "tie_word_embeddings"),
    "window as a string": (lambda c: c.update(sliding_window="big"), "sliding_window"),
    "rope as a list": (lambda c: c.update(rope_parameters=[1, 2]), "rope_parameters"),
    "4.x rope as a string": (lambda c: c.update(rope_parameters=None, rope_scaling="linear"),
                             "rope_scaling"),
    "rope theta as a string": (lambda c: c["rope_parameters"].update(rope_theta="abc"),
                               "rope_parameters.rope_theta"),
    "4.x rope theta as a string": (lambda c: c.update(rope_theta="1e4",
                                                      rope_parameters=None), "rope_theta"),
    "rope factor as a string": (lambda c: c["rope_parameters"].update(rope_type="linear",
                                                                      factor="2"),
                                "rope_parameters.factor"),
}


@pytest.mark.parametrize("case", list(CONFIG_EDITS))
def test_config_json_key_is_named(case: str, saved: Path, tmp_path: Path) -> None:
    edit, key = CONFIG_EDITS[case]
    directory = copy_model_dir(saved, tmp_path / "m", edit)
    with pytest.raises(ModelLoadError) as info:
        model_config_from_hf(directory)
    message = str(info.value)
    assert message.startswith(f"{directory / 'config.json'}: {key}: "), message
    assert "\n" not in message


def test_mistral_window_fits_a_shorter_max_model_len(saved: Path, tmp_path: Path) -> None:
    edit, _ = CONFIG_EDITS["mistral window"]
    config = model_config_from_hf(copy_model_dir(saved, tmp_path / "m", edit), max_model_len=4096)
    assert config.architecture == "mistral" and config.sliding_window == 4096


def test_a_null_mistral_window_is_full_attention(saved: Path, tmp_path: Path) -> None:
    """Mistral v0.3 writes sliding_window null: no window, unlike an absent key."""
    directory = copy_model_dir(saved, tmp_path / "m", lambda c: c.update(
        architectures=["MistralForCausalLM"], model_type="mistral",
        max_position_embeddings=32768, sliding_window=None))
    config = model_config_from_hf(directory)
    assert config.sliding_window is None and config.max_model_len == 32768


def _load(directory: Path) -> None:
    ModelRunner(with_model(tiny_config(), weights_path=str(directory)))


def test_a_tensor_the_architecture_lacks_is_refused(saved: Path, tmp_path: Path) -> None:
    directory = copy_model_dir(saved, tmp_path / "m")
    tensors = load_file(str(directory / "model.safetensors"))
    tensors["model.layers.0.self_attn.o_proj.bias"] = tensors["model.norm.weight"].clone()
    save_file(tensors, str(directory / "model.safetensors"))
    with pytest.raises(ModelLoadError, match=r"model\.safetensors: model\.layers\.0\.self_attn"
                                             r"\.o_proj\.bias: "):
        _load(directory)


def test_rotary_buffers_are_not_parameters(saved: Path, tmp_path: Path) -> None:
    """Some checkpoints carry each layer's rotary inv_freq; the reference ignores it too."""
    directory = copy_model_dir(saved, tmp_path / "m")
    tensors = load_file(str(directory / "model.safetensors"))
    tensors["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.ones(8)
    save_file(tensors, str(directory / "model.safetensors"))
    _load(directory)


def test_a_missing_qwen2_bias_is_named(saved: Path, tmp_path: Path) -> None:
    directory = copy_model_dir(saved, tmp_path / "m", lambda c: c.update(
        architectures=["Qwen2ForCausalLM"], model_type="qwen2"))
    with pytest.raises(ModelLoadError, match=r"self_attn\.[qkv]_proj\.bias: missing tensor"):
        ModelRunner(with_model(tiny_config(), weights_path=str(directory),
                               architecture="qwen2"))


def _server_exit(directory: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'client'}{os.pathsep}{ROOT / 'server'}",
           "WARMGATE_METRICS_PORT": "-1"}
    return subprocess.run(
        [sys.executable, "-m", "warmgate.server.main", "--host", "127.0.0.1", "--port", "0",
         "--device", "cpu", "--model", str(directory)],
        env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.slow
def test_server_exits_2_with_one_line_on_a_bad_config(saved: Path, tmp_path: Path) -> None:
    edit, key = CONFIG_EDITS["rope type"]
    proc = _server_exit(copy_model_dir(saved, tmp_path / "m", edit))
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "config.json" in lines[0] and key in lines[0], proc.stderr


@pytest.mark.slow
def test_server_exits_2_with_one_line_on_a_bad_tensor(saved: Path, tmp_path: Path) -> None:
    directory = copy_model_dir(saved, tmp_path / "m")
    tensors = load_file(str(directory / "model.safetensors"))
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, str(directory / "model.safetensors"))
    proc = _server_exit(directory)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if "up_proj" in line]
    assert len(errors) == 1 and "model.layers.1.mlp.up_proj.weight" in errors[0], proc.stderr


@pytest.mark.parametrize("architecture", ["llama", "mistral", "qwen2", "qwen3"])
@pytest.mark.parametrize("tied", [False, True])
def test_header_check_expects_what_the_model_holds(architecture: str, tied: bool) -> None:
    """The start-up check's expected names and shapes are exactly the model's tensors."""
    from warmgate.server.config.weight_files import expected_tensor_shapes
    from warmgate.server.runner.weights import _hf_tensors

    runner = ModelRunner(with_model(tiny_config(), architecture=architecture,
                                    tie_word_embeddings=tied))
    held = {name: tuple(t.shape) for name, t in _hf_tensors(runner.model).items()}
    assert expected_tensor_shapes(runner.config.model) == held
