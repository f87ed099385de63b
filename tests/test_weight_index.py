"""A sharded checkpoint loads through model.safetensors.index.json, as transformers loads it:
a stray single-file copy of the weights under other names beside the shards (Mistral's
repositories ship `consolidated.safetensors`) is ignored, with one log line naming it, and the
model's logits equal transformers' on the same directory. A broken index fails the start-up
naming the index and the entry."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from tests.reference_helpers import hf_last_logits, runner_for
from tests.runner_helpers import full_prefill_logits, make_runner
from tests.test_startup_errors import assert_one_line_exit_2, run_server
from warmgate.server.config.model_load_error import ModelLoadError
from warmgate.server.config.weight_files import index_weight_files
from warmgate.server.config.weight_index import INDEX_NAME
from warmgate.server.runner.weights import save_weights

STRAY = "consolidated.safetensors"


@pytest.fixture(scope="module")
def sharded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny preset's random weights in shards with an index, and a stray file beside them
    holding the first layer under the names Mistral's own format gives it."""
    directory = tmp_path_factory.mktemp("sharded") / "model"
    runner = make_runner()
    files = save_weights(runner.model, runner.config.model, directory, max_shard_bytes=16384)
    assert len(files) > 2 and (directory / INDEX_NAME).is_file()
    save_file({"layers.0.attention.wq.weight": torch.zeros(64, 64),
               "tok_embeddings.weight": torch.zeros(512, 64)}, str(directory / STRAY))
    return directory


def _edit_index(sharded: Path, tmp_path: Path, tensor: str, file: str) -> Path:
    directory = tmp_path / "model"
    directory.mkdir()
    for f in sharded.iterdir():
        (directory / f.name).write_bytes(f.read_bytes())
    index = json.loads((directory / INDEX_NAME).read_text())
    index["weight_map"][tensor] = file
    (directory / INDEX_NAME).write_text(json.dumps(index))
    return directory


def test_a_stray_file_the_index_does_not_list_is_ignored_and_named(
        sharded: Path, caplog: pytest.LogCaptureFixture) -> None:
    transformers = pytest.importorskip("transformers")
    with caplog.at_level(logging.INFO, logger="warmgate.server.config.weight_index"):
        runner = runner_for(sharded, max_model_len=64)
    lines = [r.getMessage() for r in caplog.records if STRAY in r.getMessage()]
    assert len(lines) == 1 and "ignoring 1" in lines[0], lines
    reference = transformers.AutoModelForCausalLM.from_pretrained(
        sharded, dtype=torch.float32).eval()
    prompt = list(range(3, 40, 3))
    diff = (full_prefill_logits(runner, prompt) - hf_last_logits(reference, prompt)).abs().max()
    assert diff.item() <= 1e-4


@pytest.mark.parametrize(("entry", "message"), [
    ("../model.safetensors", "is not the name of a file in the model directory"),
    ("model-00009-of-00009.safetensors", "named by the index's weight_map, but not a file"),
    ("config.json", "is not a .safetensors file"),
    ("the first shard", "the index places it in model-00001-of-"),
])
def test_a_broken_index_is_refused_naming_the_entry(sharded: Path, tmp_path: Path, entry: str,
                                                    message: str) -> None:
    if entry == "the first shard":  # model.norm.weight is in the last one
        entry = min(json.loads((sharded / INDEX_NAME).read_text())["weight_map"].values())
    directory = _edit_index(sharded, tmp_path, "model.norm.weight", entry)
    config = runner_for(sharded, max_model_len=64).config.model
    with pytest.raises(ModelLoadError, match=message):
        index_weight_files(directory, config)


@pytest.mark.slow
def test_a_broken_index_fails_the_start_up_in_one_line(sharded: Path, tmp_path: Path) -> None:
    directory = _edit_index(sharded, tmp_path, "model.norm.weight", "gone.safetensors")
    assert_one_line_exit_2(run_server("--model", str(directory), "--device", "cpu"), "--model",
                           "gone.safetensors", INDEX_NAME)
