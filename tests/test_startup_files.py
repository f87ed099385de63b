"""Hostile or broken start-up files end the start-up with one line naming the file (and key),
exit 2, never a traceback: JSON nested thousands deep in any JSON file the start-up reads, a
head count of 0, a layer count no file could hold, a token file without end, two tensors
sharing bytes, a FIFO or directory where a file belongs, and an EOS list the size of a
vocabulary (whose log lines also stay short)."""

from __future__ import annotations

import json
import logging
import os
import resource
import shutil
import struct
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.test_startup_errors import EXIT_WITHIN_S, ROOT, assert_one_line_exit_2, run_server
from tests.text_helpers import write_tiny_model
from warmgate.server.config.hf_config import ModelLoadError, model_config_from_hf
from warmgate.server.config.model_files import ModelFileError, check_inside_model_dir
from warmgate.server.config.runner_config import ModelConfig
from warmgate.server.config.safetensors_header import read_header
from warmgate.server.config.security import (
    MAX_FILE_BYTES,
    SecurityConfigError,
    load_server_security,
)
from warmgate.server.text.eos import MAX_EOS_TOKEN_IDS, MAX_LOGGED_CHARS, read_eos_token_ids
from warmgate.server.text.errors import TextLoadError
from warmgate.server.text.model_text import load_model_text

# Far deeper than Python's recursion limit: json.loads raised RecursionError.
DEEP = "[" * 100_000 + "]" * 100_000
TOO_DEEP = "nested deeper than a JSON reader follows"


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("startup-files") / "model")


def _copy(tiny_dir: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(tiny_dir, tmp_path / "model"))


def _model(directory: Path) -> ModelConfig:
    return model_config_from_hf(directory)


def _edit_config(directory: Path, edit: Callable[[dict[str, Any]], None]) -> None:
    config = json.loads((directory / "config.json").read_text())
    edit(config)
    (directory / "config.json").write_text(json.dumps(config))


def _rewrite_header(directory: Path, edit: Callable[[dict[str, Any]], bytes]) -> None:
    """model.safetensors with its header replaced by edit(header); the data unchanged (so
    every offset, relative to the data, still holds)."""
    path = directory / "model.safetensors"
    data = path.read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    text = edit(json.loads(data[8:8 + length]))
    path.write_bytes(struct.pack("<Q", len(text)) + text + data[8 + length:])


def _deep_metadata(header: dict[str, Any]) -> bytes:
    return json.dumps(header).encode()[:-1] + b', "__metadata__": ' + DEEP.encode() + b"}"


def _overlap(header: dict[str, Any]) -> bytes:
    """model.layers.0.post_attention_layernorm.weight moved to 4 bytes past the start of
    model.layers.0.input_layernorm.weight (both F32 [64]: the span keeps its size, only its
    bytes are shared)."""
    first = header["model.layers.0.input_layernorm.weight"]
    moved = header["model.layers.0.post_attention_layernorm.weight"]
    assert (first["dtype"], first["shape"]) == (moved["dtype"], moved["shape"])
    begin, end = first["data_offsets"]
    assert any(info.get("data_offsets", [None])[0] == end  # not the last tensor
               for info in header.values())
    moved["data_offsets"] = [begin + 4, end + 4]
    return json.dumps(header).encode()


# Each case: what to do to a copy of the tiny model, and what the one line must name.
Breakage = Callable[[Path], None]
CASES: dict[str, tuple[Breakage, tuple[str, ...]]] = {
    "deep config.json": (
        lambda d: _edit_config(d, lambda c: c.update(x="@@")) or (d / "config.json").write_text(
            (d / "config.json").read_text().replace('"@@"', DEEP)),
        ("config.json", TOO_DEEP)),
    "deep generation_config.json": (
        lambda d: (d / "generation_config.json").write_text('{"eos_token_id": 2, "x": ' + DEEP
                                                            + "}"),
        ("generation_config.json", TOO_DEEP)),
    "deep tokenizer_config.json": (
        lambda d: (d / "tokenizer_config.json").write_text('{"x": ' + DEEP + "}"),
        ("tokenizer_config.json", TOO_DEEP)),
    "deep safetensors header": (lambda d: _rewrite_header(d, _deep_metadata),
                                ("model.safetensors", TOO_DEEP)),
    "zero heads": (lambda d: _edit_config(d, lambda c: c.update(num_attention_heads=0)),
                   ("config.json", "num_attention_heads: 0 must be >= 1")),
    "overlapping tensors": (lambda d: _rewrite_header(d, _overlap),
                            ("model.safetensors",
                             "model.layers.0.post_attention_layernorm.weight: bytes",
                             "overlap model.layers.0.input_layernorm.weight's")),
    "FIFO chat template": (
        lambda d: ((d / "chat_template.jinja").unlink(), os.mkfifo(d / "chat_template.jinja")),
        ("chat_template.jinja", "is a FIFO (named pipe); it must be a regular file")),
    "directory chat template": (
        lambda d: ((d / "chat_template.jinja").unlink(), (d / "chat_template.jinja").mkdir()),
        ("chat_template.jinja", "is a directory; it must be a regular file")),
    "an EOS id per token": (
        lambda d: (d / "generation_config.json").write_text(json.dumps(
            {"eos_token_id": list(range(49_152))})),
        ("generation_config.json", f"eos_token_id: 49152 ids, at most {MAX_EOS_TOKEN_IDS}")),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_broken_start_up_file_is_one_line_naming_it_and_exit_2(case: str, tiny_dir: Path,
                                                                 tmp_path: Path) -> None:
    breakage, needles = CASES[case]
    model = _copy(tiny_dir, tmp_path)
    breakage(model)
    line = assert_one_line_exit_2(run_server("--model", str(model)), "argument --model:",
                                  *needles)
    assert len(line) < 1000, line


# The readers themselves, each with its file: what the server's start-up turns into the line.
def test_deep_json_in_each_reader_is_an_error_naming_the_file(tiny_dir: Path,
                                                              tmp_path: Path) -> None:
    model = _copy(tiny_dir, tmp_path)
    CASES["deep config.json"][0](model)
    with pytest.raises(ModelLoadError, match=TOO_DEEP) as config_error:
        _model(model)
    assert config_error.value.path == str(model / "config.json")
    for case, name in (("deep generation_config.json", "generation_config.json"),
                       ("deep tokenizer_config.json", "tokenizer_config.json")):
        text_model = _copy(tiny_dir, tmp_path / case.replace(" ", "-"))
        CASES[case][0](text_model)
        with pytest.raises(TextLoadError, match=TOO_DEEP) as text_error:
            load_model_text(ModelConfig.from_preset("tiny", weights_path=str(text_model)))
        assert text_error.value.path == str(text_model / name)
    CASES["deep safetensors header"][0](model)
    with pytest.raises(ModelLoadError, match=TOO_DEEP):
        read_header(model / "model.safetensors")


def test_overlapping_tensor_bytes_are_refused_by_the_header_check(tiny_dir: Path,
                                                                  tmp_path: Path) -> None:
    model = _copy(tiny_dir, tmp_path)
    entries = read_header(model / "model.safetensors")  # the intact file: disjoint spans
    assert len(entries) > 2
    CASES["overlapping tensors"][0](model)
    with pytest.raises(ModelLoadError) as info:
        read_header(model / "model.safetensors")
    assert info.value.key == "model.layers.0.post_attention_layernorm.weight"
    assert "overlap model.layers.0.input_layernorm.weight's" in info.value.message


@pytest.mark.parametrize("case", ["FIFO chat template", "directory chat template"])
def test_a_model_file_that_is_no_regular_file_is_named(case: str, tiny_dir: Path,
                                                       tmp_path: Path) -> None:
    model = _copy(tiny_dir, tmp_path)
    CASES[case][0](model)
    with pytest.raises(ModelFileError) as info:
        check_inside_model_dir(model)
    assert info.value.path == str(model / "chat_template.jinja")


def test_eos_ids_are_bounded_and_the_log_keeps_a_losing_list_short(
        tiny_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    model = _copy(tiny_dir, tmp_path)
    ids = list(range(MAX_EOS_TOKEN_IDS))
    (model / "generation_config.json").write_text(json.dumps({"eos_token_id": ids}))
    assert read_eos_token_ids(model, 512)[0] == tuple(ids)  # at the bound: served
    (model / "generation_config.json").write_text(json.dumps({"eos_token_id": [*ids, 64]}))
    with pytest.raises(TextLoadError, match=f"{MAX_EOS_TOKEN_IDS + 1} ids, at most"):
        read_eos_token_ids(model, 512)
    # config.json's list loses to generation_config.json's and is only logged: in short.
    (model / "generation_config.json").write_text(json.dumps({"eos_token_id": 2}))
    _edit_config(model, lambda c: c.update(eos_token_id=list(range(49_152))))
    with caplog.at_level(logging.WARNING, logger="warmgate.server.text.eos"):
        assert read_eos_token_ids(model, 512) == ((2,), "generation_config.json")
    [record] = caplog.records
    assert len(record.getMessage()) < MAX_LOGGED_CHARS + 300, len(record.getMessage())
    assert "49152 items" in record.getMessage()


def test_a_token_file_past_the_bound_is_refused(tmp_path: Path) -> None:
    """The bound the read stops at (the next test reads /dev/zero, which has no end)."""
    endless = tmp_path / "tokens"
    endless.write_bytes(b"t" * (MAX_FILE_BYTES + 1))
    with pytest.raises(SecurityConfigError, match=f"more than {MAX_FILE_BYTES >> 20} MiB"):
        load_server_security(auth_token_file=str(endless), tls_cert=None, tls_key=None,
                             tls_client_ca=None)
    endless.write_bytes(b"t" * MAX_FILE_BYTES)  # a token file of exactly the bound is read
    assert load_server_security(auth_token_file=str(endless), tls_cert=None, tls_key=None,
                                tls_client_ca=None).auth_tokens == (b"t" * MAX_FILE_BYTES,)


def _cap_address_space() -> None:
    # Room for the server (it runs in 4 GiB), not for a read without end: one would end in
    # a MemoryError here rather than in the host's OOM killer.
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))


def test_dev_zero_as_the_token_file_is_one_line_and_exit_2() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WARMGATE_")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "client"), str(ROOT / "server")])
    done = subprocess.run(
        [sys.executable, "-m", "warmgate.server.main", "--host", "127.0.0.1", "--port", "0",
         "--device", "cpu", "--metrics-port", "-1", "--auth-token-file", "/dev/zero"],
        env=env, capture_output=True, text=True, timeout=EXIT_WITHIN_S, check=False,
        preexec_fn=_cap_address_space)
    assert_one_line_exit_2(done, "argument --auth-token-file:", "/dev/zero holds more than")


# Layer counts no weight file could hold, checked in a process whose address space is
# capped: listing 1e30 layers' tensor names (or 1e30 layer types) filled a 23 GiB host
# before anything failed, and must not be tried.
_HUGE_LAYERS = textwrap.dedent("""
    import resource, sys
    resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
    from warmgate.server.config.hf_config import ModelLoadError, model_config_from_hf
    from warmgate.server.config.weight_files import index_weight_files
    try:
        index_weight_files(sys.argv[1], model_config_from_hf(sys.argv[1]))
    except ModelLoadError as exc:
        print(exc)
""")


@pytest.mark.parametrize("edit", [
    {"num_hidden_layers": 10**30},
    # Qwen2's window applies from max_window_layers on: whether any layer slides.
    {"num_hidden_layers": 10**30, "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
     "use_sliding_window": True, "sliding_window": 4096, "max_window_layers": 1},
], ids=["llama", "qwen2-window"])
def test_a_layer_count_past_the_files_is_refused_without_listing_the_layers(
        edit: dict[str, Any], tiny_dir: Path, tmp_path: Path) -> None:
    model = _copy(tiny_dir, tmp_path)
    _edit_config(model, lambda c: c.update(edit))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "client"),
                                                        str(ROOT / "server")])}
    done = subprocess.run([sys.executable, "-c", _HUGE_LAYERS, str(model)], env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith(f"{model / 'config.json'}: num_hidden_layers: "
                                  f"{10**30} layers, but the weight files hold "), done.stdout
