"""The model directory's files must be its own: a template, tokenizer or config symlinked to
a file outside it fails the start-up (exit 2, one line naming the file), as does a template
whose compile passes its bounds; symlinks inside the directory, and a Hugging Face cache
snapshot's links into its own blobs/, still load."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.test_startup_errors import assert_one_line_exit_2, run_server
from tests.text_helpers import write_tiny_model
from warmgate.server.config.model_files import ModelFileError, check_inside_model_dir
from warmgate.server.config.runner_config import ModelConfig
from warmgate.server.startup import load_server_config
from warmgate.server.text.errors import TextLoadError
from warmgate.server.text.model_text import load_model_text


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("tiny-files") / "model")


def _copy(tiny_dir: Path, tmp_path: Path, name: str = "model") -> Path:
    return Path(shutil.copytree(tiny_dir, tmp_path / name))


@pytest.mark.parametrize("name", ["chat_template.jinja", "tokenizer.json", "config.json"])
def test_symlink_out_of_the_model_dir_fails_the_start_up(tiny_dir: Path, tmp_path: Path,
                                                         name: str) -> None:
    model = _copy(tiny_dir, tmp_path)
    secret = tmp_path / "secret" / name
    secret.parent.mkdir()
    (model / name).rename(secret)  # the real content, so only where it lies is wrong
    (model / name).symlink_to(secret)
    line = assert_one_line_exit_2(run_server("--model", str(model)), "--model",
                                  str(model / name), "outside the model directory")
    assert str(secret) in line


def test_template_whose_compile_fails_its_bounds_fails_the_start_up(tiny_dir: Path,
                                                                    tmp_path: Path) -> None:
    model = _copy(tiny_dir, tmp_path)
    # Nesting deep enough to exhaust jinja's recursive parser, inside the worker process.
    (model / "chat_template.jinja").write_text("{% if 1 %}" * 5000 + "{% endif %}" * 5000)
    assert_one_line_exit_2(run_server("--model", str(model)), "--model",
                           str(model / "chat_template.jinja"), "failed to compile: RecursionError")


def _load(model: Path) -> None:
    config = load_server_config(["--model", str(model), "--device", "cpu"], environ={})
    text = load_model_text(config.runner.model, config.serving)
    assert text.tokenizer is not None and text.tokenizer.chat_template is not None
    assert text.tokenizer.encode_chat([{"role": "user", "content": "Hello"}])
    text.tokenizer.chat_template.close()


def test_symlinks_inside_the_model_dir_still_load(tiny_dir: Path, tmp_path: Path) -> None:
    model = _copy(tiny_dir, tmp_path)
    for name in ("chat_template.jinja", "tokenizer.json", "config.json"):
        kept = model / "files" / name
        kept.parent.mkdir(exist_ok=True)
        (model / name).rename(kept)
        (model / name).symlink_to(Path("files") / name)  # relative, as hub caches write
    _load(model)


def test_hub_cache_snapshot_links_into_its_blobs(tiny_dir: Path, tmp_path: Path) -> None:
    repo = tmp_path / "models--org--tiny"
    snapshot = repo / "snapshots" / "0123abcd"
    (repo / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for i, path in enumerate(sorted(tiny_dir.iterdir())):
        blob = repo / "blobs" / f"blob{i}"
        shutil.copy(path, blob)
        (snapshot / path.name).symlink_to(Path("../../blobs") / blob.name)
    _load(snapshot)
    # Another repository's blobs are outside.
    other = tmp_path / "models--org--other" / "blobs"
    other.mkdir(parents=True)
    (snapshot / "tokenizer.json").unlink()
    shutil.copy(tiny_dir / "tokenizer.json", other / "tok")
    (snapshot / "tokenizer.json").symlink_to(other / "tok")
    with pytest.raises(ModelFileError, match=r"tokenizer.json resolves to .* outside"):
        check_inside_model_dir(snapshot)
    with pytest.raises(TextLoadError, match=r"tokenizer\.json: resolves to"):
        load_model_text(ModelConfig(weights_path=str(snapshot)))
