"""The model directory's files must be the directory's own: a file the loader reads (config,
tokenizer, chat template, weights) that is a symlink to somewhere else would be served back
(a chat template symlinked to a secret came back through prompt_logprobs' token ids).

Symlinks are followed and the real path must lie under the directory's real path. One place
outside is allowed: a Hugging Face hub cache snapshot (`models--org--name/snapshots/<rev>/`)
keeps every file as a symlink into that repository's own `blobs/` folder.

And each must be a regular file: a directory or FIFO named chat_template.jinja was taken as
"no chat template" (the readers ask is_file()), and opening a FIFO named *.safetensors would
block the start-up until something wrote to it.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

# What the loader opens by name (config.hf_config, config.weight_files, text.*).
MODEL_FILE_NAMES = ("config.json", "generation_config.json", "tokenizer.json",
                    "tokenizer_config.json", "chat_template.jinja",
                    "model.safetensors.index.json")
WEIGHT_FILE_PATTERN = "*.safetensors"
HUB_SNAPSHOTS = "snapshots"
HUB_REPO_PREFIX = "models--"
HUB_BLOBS = "blobs"


class ModelFileError(ValueError):
    """A model file resolving outside its directory (or nowhere); one line naming it."""

    def __init__(self, path: Path, detail: str) -> None:
        super().__init__(f"{path} {detail}")
        self.path = str(path)
        self.detail = detail


def allowed_roots(directory: Path) -> tuple[Path, ...]:
    """Where the directory's files may really live."""
    root = directory.resolve()
    roots = [root]
    snapshots = root.parent
    if snapshots.name == HUB_SNAPSHOTS and snapshots.parent.name.startswith(HUB_REPO_PREFIX):
        roots.append(snapshots.parent / HUB_BLOBS)
    return tuple(roots)


def check_inside_model_dir(directory: str | Path) -> None:
    """ModelFileError for the first file the loader would open from `directory` whose real
    path is outside it (its absence is for the loader to report)."""
    directory = Path(directory)
    roots = allowed_roots(directory)
    names = [directory / name for name in MODEL_FILE_NAMES]
    for path in names + sorted(directory.glob(WEIGHT_FILE_PATTERN)):
        if not path.is_symlink() and not path.exists():
            continue
        try:
            real = path.resolve()
        except (OSError, RuntimeError) as exc:  # RuntimeError: a symlink loop
            raise ModelFileError(path, f"cannot be resolved ({exc})") from None
        if not any(real.is_relative_to(root) for root in roots):
            raise ModelFileError(path, f"resolves to {real}, outside the model directory "
                                 f"{roots[0]}; copy the file into the directory (a symlink "
                                 "may point only inside it)")
        _check_regular(path)


def _check_regular(path: Path) -> None:
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:  # a dangling symlink: the loader reports its absence
        if not path.is_symlink():
            raise ModelFileError(path, f"cannot be read ({exc.strerror})") from None
        return
    if not stat.S_ISREG(mode):
        raise ModelFileError(path, f"is {_kind(mode)}; it must be a regular file (or a "
                             "symlink to one inside the directory)")


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "a special file"
