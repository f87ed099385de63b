"""Pairs of config.json keys (and files) that can disagree: each resolves as transformers 5
does, and the reader records a note naming the key that lost (logged when the weights load),
or the load is refused with one line naming the key."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from safetensors.torch import load_file, save_file

from tests.runner_helpers import copy_model_dir, save_tiny, tiny_config, with_model
from warmgate.server.config.config_notes import ConfigNote
from warmgate.server.config.hf_config import ModelLoadError, read_model_dir
from warmgate.server.runner.model_runner import ModelRunner
from warmgate.server.text.eos import read_eos_token_ids

Edit = Callable[[dict[str, Any]], None]
LLAMA3 = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 64}


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model, untied: its file holds an lm_head.weight of its own."""
    return save_tiny(tmp_path_factory.mktemp("tiny"))




def _notes(notes: tuple[ConfigNote, ...], key: str) -> list[ConfigNote]:
    return [n for n in notes if n.key == key]


def test_rope_scaling_wins_over_rope_parameters_with_its_own_theta(saved: Path,
                                                                   tmp_path: Path) -> None:
    """transformers reads `rope_scaling or rope_parameters`; the loser's rope_theta is never
    read, so theta is the top-level one, else 10000."""
    directory = copy_model_dir(saved, tmp_path / "m", lambda c: c.update(
        rope_parameters=dict(LLAMA3), rope_scaling={"rope_type": "linear", "factor": 4.0}))
    config, notes = read_model_dir(directory)
    assert (config.rope.rope_type, config.rope.factor, config.rope.theta) == ("linear", 4.0,
                                                                             10000.0)
    [note] = _notes(notes, "rope_scaling")
    assert note.warning and "rope_parameters (llama3 theta 500000 factor 8" in note.text
    assert "serving linear theta 10000 factor 4" in note.text


def test_rope_keys_that_agree_load_with_an_info_note(saved: Path, tmp_path: Path) -> None:
    scaling = {k: v for k, v in LLAMA3.items() if k != "rope_theta"}
    directory = copy_model_dir(saved, tmp_path / "m", lambda c: c.update(
        rope_parameters=dict(LLAMA3), rope_scaling=scaling, rope_theta=500000.0))
    config, notes = read_model_dir(directory)
    assert config.rope.rope_type == "llama3" and config.rope.theta == 500000.0
    [note] = _notes(notes, "rope_scaling")
    assert not note.warning and "agree" in note.text


def test_an_empty_rope_scaling_leaves_rope_parameters(saved: Path, tmp_path: Path) -> None:
    directory = copy_model_dir(saved, tmp_path / "m", lambda c: c.update(
        rope_parameters=dict(LLAMA3), rope_scaling={}))
    config, notes = read_model_dir(directory)
    assert config.rope.rope_type == "llama3" and not _notes(notes, "rope_scaling")


# (edit, the key of the note, a warning?, the resolved value, what it must be)
PAIRS: dict[str, tuple[Edit, str, bool, Callable[[Any], Any], Any]] = {
    "rope_theta twice": (lambda c: c.update(rope_theta=2000.0), "rope_theta", True,
                         lambda m: m.rope.theta, 10000.0),
    "type and rope_type": (lambda c: c["rope_parameters"].update(type="linear", factor=2.0),
                           "rope_parameters.type", True, lambda m: m.rope.rope_type,
                           "default"),
    "original context twice": (lambda c: c.update(rope_parameters=dict(LLAMA3),
                                                  original_max_position_embeddings=32),
                               "original_max_position_embeddings", True,
                               lambda m: m.rope.original_max_position_embeddings, 32),
    "partial rotary twice": (lambda c: (c["rope_parameters"].update(partial_rotary_factor=1.0),
                                        c.update(partial_rotary_factor=0.5)),
                             "partial_rotary_factor", True, lambda m: m.head_dim, 16),
    "head_dim over hidden/heads": (lambda c: c.update(head_dim=32), "head_dim", False,
                                   lambda m: m.head_dim, 32),
    "mistral kv heads absent": (lambda c: (c.update(architectures=["MistralForCausalLM"],
                                                    model_type="mistral", sliding_window=None,
                                                    num_attention_heads=16),
                                           c.pop("num_key_value_heads"), c.pop("head_dim")),
                                "num_key_value_heads", False, lambda m: m.num_kv_heads, 8),
    "dtype and torch_dtype": (lambda c: c.update(dtype="bfloat16", torch_dtype="float16"),
                              "torch_dtype", True, lambda m: m.architecture, "llama"),
    "qwen window off": (lambda c: c.update(architectures=["Qwen2ForCausalLM"],
                                           model_type="qwen2", sliding_window=16,
                                           use_sliding_window=False),
                        "sliding_window", False, lambda m: m.sliding_window, None),
    "mistral window on regardless": (lambda c: c.update(architectures=["MistralForCausalLM"],
                                                        model_type="mistral",
                                                        sliding_window=4096,
                                                        use_sliding_window=False),
                                     "use_sliding_window", True, lambda m: m.sliding_window,
                                     4096),
    "llama window unread": (lambda c: c.update(sliding_window=16), "sliding_window", False,
                            lambda m: m.sliding_window, None),
}


@pytest.mark.parametrize("case", list(PAIRS))
def test_each_pair_resolves_as_transformers_with_a_note(case: str, saved: Path,
                                                        tmp_path: Path) -> None:
    edit, key, warning, value_of, want = PAIRS[case]
    directory = copy_model_dir(saved, tmp_path / "m", edit)
    config, notes = read_model_dir(directory)
    assert value_of(config) == want
    found = _notes(notes, key)
    assert len(found) == 1 and found[0].warning == warning, notes


def test_null_kv_heads_mean_all_heads(saved: Path, tmp_path: Path) -> None:
    directory = copy_model_dir(saved, tmp_path / "m", lambda c: c.update(
        architectures=["MistralForCausalLM"], model_type="mistral", sliding_window=None,
        num_key_value_heads=None))
    config, notes = read_model_dir(directory)
    assert config.num_kv_heads == config.num_heads and not _notes(notes,
                                                                  "num_key_value_heads")


def test_model_type_disagreeing_with_architectures_is_refused(saved: Path,
                                                              tmp_path: Path) -> None:
    directory = copy_model_dir(saved, tmp_path / "m", lambda c: c.update(model_type="qwen2"))
    with pytest.raises(ModelLoadError) as info:
        read_model_dir(directory)
    assert str(info.value).startswith(f"{directory / 'config.json'}: model_type: ")
    assert "\n" not in str(info.value)


def _set_head(directory: Path, head_from: str) -> None:
    tensors = load_file(str(directory / "model.safetensors"))
    tensors["lm_head.weight"] = tensors[head_from].clone()
    save_file(tensors, str(directory / "model.safetensors"))


def test_a_tied_config_over_a_different_head_keeps_the_files_head(saved: Path,
                                                                  tmp_path: Path) -> None:
    directory = copy_model_dir(saved, tmp_path / "m", lambda c: c.update(tie_word_embeddings=True))
    config, notes = read_model_dir(directory)
    assert config.tie_word_embeddings is False
    [note] = _notes(notes, "lm_head.weight")
    assert note.warning and "differs from model.embed_tokens.weight" in note.text
    runner = ModelRunner(with_model(tiny_config(), weights_path=str(directory)))
    want = load_file(str(directory / "model.safetensors"))["lm_head.weight"]
    assert runner.model.lm_head is not None and bool((runner.model.lm_head == want).all())


def test_a_tied_config_over_an_equal_head_is_tied(saved: Path, tmp_path: Path) -> None:
    directory = copy_model_dir(saved, tmp_path / "m", lambda c: c.update(tie_word_embeddings=True))
    _set_head(directory, "model.embed_tokens.weight")
    config, notes = read_model_dir(directory)
    assert config.tie_word_embeddings is True
    [note] = _notes(notes, "lm_head.weight")
    assert not note.warning and "equal" in note.text
    ModelRunner(with_model(tiny_config(), weights_path=str(directory),
                           tie_word_embeddings=True))


def test_the_load_logs_every_note_once(saved: Path, tmp_path: Path,
                                       caplog: pytest.LogCaptureFixture) -> None:
    directory = copy_model_dir(saved, tmp_path / "m", lambda c: c.update(
        tie_word_embeddings=True, rope_parameters=dict(LLAMA3),
        rope_scaling={"rope_type": "linear", "factor": 4.0}))
    config, notes = read_model_dir(directory, max_model_len=128)
    with caplog.at_level(logging.INFO, logger="warmgate.server.runner.weights"):
        ModelRunner(with_model(tiny_config(), weights_path=str(directory),
                               rope=config.rope, tie_word_embeddings=False))
    for n in notes:
        lines = [r for r in caplog.records if f": {n.key}: {n.text}" in r.getMessage()]
        assert len(lines) == 1, n
        assert lines[0].levelno == (logging.WARNING if n.warning else logging.INFO)
    assert any(n.warning for n in notes) and len(notes) >= 2


def _eos_dir(tmp_path: Path, config_eos: Any, generation: dict[str, Any] | None) -> Path:
    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": config_eos}))
    if generation is not None:
        (tmp_path / "generation_config.json").write_text(json.dumps(generation))
    return tmp_path


def test_generation_config_eos_wins_with_a_warning(tmp_path: Path,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    directory = _eos_dir(tmp_path / "m", 5, {"eos_token_id": [7, 8]})
    with caplog.at_level(logging.INFO, logger="warmgate.server.text.eos"):
        assert read_eos_token_ids(directory, 64) == ((7, 8), "generation_config.json")
    [record] = caplog.records
    assert record.levelno == logging.WARNING and "[7, 8] win over config.json's 5" in \
        record.getMessage()
    caplog.clear()
    same = _eos_dir(tmp_path / "same", [8, 7], {"eos_token_id": [7, 8]})
    with caplog.at_level(logging.INFO, logger="warmgate.server.text.eos"):
        read_eos_token_ids(same, 64)
    assert not caplog.records


def test_a_generation_config_without_eos_falls_back_with_a_warning(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    directory = _eos_dir(tmp_path / "m", 5, {"temperature": 0.6})
    with caplog.at_level(logging.INFO, logger="warmgate.server.text.eos"):
        assert read_eos_token_ids(directory, 64) == ((5,), "config.json")
    [record] = caplog.records
    assert "generation_config.json sets no eos_token_id" in record.getMessage()
