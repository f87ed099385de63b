"""Which safetensors files of a model directory hold its weights.

With a `model.safetensors.index.json`, the files its `weight_map` names and no others, as
transformers loads a sharded checkpoint: a Hub repository may also ship a single-file copy
of the same weights beside the shards (Mistral's `consolidated.safetensors`), whose tensors
would otherwise be read twice. Without an index, every `*.safetensors` file of the directory.

The index must be a plain name list: a shard named by a path (`../x.safetensors`, `a/b`) or
that does not exist fails the load, naming the index and the entry.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from warmgate.server.config.json_text import parse_json
from warmgate.server.config.model_load_error import ModelLoadError

logger = logging.getLogger(__name__)

INDEX_NAME = "model.safetensors.index.json"
WEIGHT_SUFFIX = ".safetensors"
# An index lists each tensor once: a few MB for the largest checkpoints (DeepSeek-V3's is
# about 9 MB). Past this it is no index.
MAX_INDEX_BYTES = 64 * 2**20


@dataclass(frozen=True)
class WeightFiles:
    files: tuple[Path, ...]  # sorted
    # tensor name -> the file the index says holds it (empty without an index)
    weight_map: dict[str, Path]
    unlisted: tuple[Path, ...]  # *.safetensors files the index leaves out (ignored)


def _read_index(path: Path) -> dict[str, str]:
    try:
        if path.stat().st_size > MAX_INDEX_BYTES:
            raise ModelLoadError(path, "weight_map", f"the file is larger than "
                                 f"{MAX_INDEX_BYTES // 2**20} MiB; an index lists names only")
        index = parse_json(path.read_text())
    except (OSError, ValueError) as exc:  # ValueError: undecodable, not JSON, or too deep
        raise ModelLoadError(path, INDEX_NAME, f"unreadable: {exc}") from None
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise ModelLoadError(path, "weight_map", "missing or empty: an index maps each tensor "
                             "name to its file")
    for name, file in weight_map.items():
        if not isinstance(file, str) or Path(file).name != file or file in (".", ".."):
            raise ModelLoadError(path, f"weight_map.{name}", f"{file!r} is not the name of a "
                                 "file in the model directory")
        if not file.endswith(WEIGHT_SUFFIX):
            raise ModelLoadError(path, f"weight_map.{name}", f"{file!r} is not a "
                                 f"{WEIGHT_SUFFIX} file")
    return weight_map


def weight_files(directory: str | Path) -> WeightFiles:
    """The directory's weight files (see the module's docstring); ModelLoadError for a broken
    index or a shard it names that is not there. No file at all is for the caller to say."""
    directory = Path(directory)
    every = tuple(sorted(directory.glob("*" + WEIGHT_SUFFIX)))
    index = directory / INDEX_NAME
    if not index.exists():
        return WeightFiles(every, {}, ())
    by_name = {name: directory / file for name, file in _read_index(index).items()}
    listed = tuple(sorted(set(by_name.values())))
    for file in listed:
        if not file.is_file():
            raise ModelLoadError(index, file.name, "named by the index's weight_map, but not "
                                 "a file in the model directory")
    return WeightFiles(listed, by_name, tuple(f for f in every if f not in set(listed)))


def log_unlisted(files: WeightFiles, directory: str | Path) -> None:
    """One line naming the files the index leaves out, which the load ignores."""
    if files.unlisted:
        logger.info("model %s: %s lists %d weight files; ignoring %d it does not list: %s",
                    directory, INDEX_NAME, len(files.files), len(files.unlisted),
                    ", ".join(f.name for f in files.unlisted))
