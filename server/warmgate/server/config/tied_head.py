"""tie_word_embeddings against the head the weight files hold.

transformers ties lm_head to embed_tokens only when the checkpoint does not hold a different
head: a file with its own lm_head.weight that differs from the embeddings keeps it (and
warns), one equal to them is tied. The comparison reads both tensors' bytes from the files
(plain Python, no torch); it runs only when a tied config's files hold an lm_head.weight, and
its answer is cached for files that have not changed since.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path

from warmgate.server.config.safetensors_header import TensorEntry, read_header
from warmgate.server.config.weight_index import weight_files

HEAD = "lm_head.weight"
EMBEDDINGS = "model.embed_tokens.weight"
_CHUNK_BYTES = 16 * 2**20


@dataclass(frozen=True)
class FileHead:
    """The lm_head.weight a tied config's files hold, and whether it equals the embeddings."""

    path: Path
    equal: bool


def _find(files: list[Path], name: str) -> tuple[Path, TensorEntry] | None:
    for f in files:
        entry = read_header(f).get(name)
        if entry is not None:
            return f, entry
    return None


def file_head(directory: Path) -> FileHead | None:
    """None when the weight files hold no lm_head.weight (or no embeddings to compare it
    with: the tensor check then names the missing one)."""
    files = list(weight_files(directory).files)
    head, embeddings = _find(files, HEAD), _find(files, EMBEDDINGS)
    if head is None or embeddings is None:
        return None
    (head_path, h), (emb_path, e) = head, embeddings
    if (h.dtype, h.shape) != (e.dtype, e.shape):
        # Different bytes per value: not the embeddings saved twice. Keeping the file's head
        # is right either way (equal values give the same logits).
        return FileHead(head_path, False)
    return FileHead(head_path, _spans_equal(_span(head_path, h), _span(emb_path, e)))


def _span(path: Path, entry: TensorEntry) -> tuple[str, int, int, int, int]:
    st = os.stat(path)
    # The file's size and mtime key the cache: a rewritten file is compared again.
    return str(path), entry.begin, entry.end, st.st_size, st.st_mtime_ns


@functools.lru_cache(maxsize=8)
def _spans_equal(a: tuple[str, int, int, int, int], b: tuple[str, int, int, int, int]) -> bool:
    (path_a, begin_a, end_a, _, _), (path_b, begin_b, end_b, _, _) = a, b
    if end_a - begin_a != end_b - begin_b:
        return False
    with open(path_a, "rb") as fa, open(path_b, "rb") as fb:
        fa.seek(begin_a)
        fb.seek(begin_b)
        left = end_a - begin_a
        while left > 0:
            n = min(left, _CHUNK_BYTES)
            if fa.read(n) != fb.read(n):
                return False
            left -= n
    return True
