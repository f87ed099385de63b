"""weight_stream: the parallel, staged safetensors reader behind load_weights (CPU runs both
the direct path and the staged one the GPU takes, with slices small enough to split and
reuse)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from warmgate.server.config.hf_config import ModelLoadError
from warmgate.server.config.weight_files import read_header
from warmgate.server.runner.weight_stream import plan_reads, stream_into


def _tensors() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return {"big": torch.randn(37, 19, generator=gen).to(torch.bfloat16),
            "norm.a": torch.randn(5, generator=gen).to(torch.bfloat16),
            "norm.b": torch.randn(3, generator=gen).to(torch.bfloat16),
            "wide": torch.randn(4, 130, generator=gen),
            "empty": torch.zeros(0, 4, dtype=torch.bfloat16)}


def _save(tmp_path: Path, tensors: dict[str, torch.Tensor]) -> Path:
    path = tmp_path / "model.safetensors"
    save_file(tensors, str(path))
    return path


@pytest.mark.parametrize("staged", [False, True])
@pytest.mark.parametrize("slice_bytes", [7, 64, 1 << 20])
def test_every_byte_lands_in_its_target(tmp_path: Path, staged: bool, slice_bytes: int) -> None:
    tensors = _tensors()
    path = _save(tmp_path, tensors)
    header = read_header(path)
    targets = {n: torch.full_like(t, 7) for n, t in tensors.items()}
    stats = stream_into([(path, header[n], targets[n]) for n in tensors], torch.device("cpu"),
                        slice_bytes=slice_bytes, num_readers=3, staged=staged)
    for name, t in tensors.items():
        assert torch.equal(targets[name], t), name
    assert stats.bytes_read == sum(t.numel() * t.element_size() for t in tensors.values())
    assert stats.staged is staged


def test_small_neighbours_share_a_read_and_big_tensors_split(tmp_path: Path) -> None:
    tensors = _tensors()
    path = _save(tmp_path, tensors)
    header = read_header(path)
    reads = plan_reads([(0, path, header[n], torch.empty_like(t)) for n, t in tensors.items()],
                       slice_bytes=64)
    assert all(r.nbytes <= 64 for r in reads)
    assert sum(r.nbytes for r in reads) == sum(e.end - e.begin for e in header.values())
    # norm.a (10 bytes) and norm.b (6) sit next to each other in the file: one read.
    assert any(len(r.pieces) >= 2 for r in reads)


def test_another_file_dtype_is_cast_on_the_device(tmp_path: Path) -> None:
    source = torch.randn(9, 33, generator=torch.Generator().manual_seed(1))  # float32 file
    path = _save(tmp_path, {"w": source})
    fused = torch.zeros(20, 33, dtype=torch.bfloat16)
    view = fused[5:14]
    stream_into([(path, read_header(path)["w"], view)], torch.device("cpu"), slice_bytes=100,
                num_readers=2, staged=True)
    assert torch.equal(view, source.to(torch.bfloat16))
    assert torch.count_nonzero(fused[:5]) == 0 and torch.count_nonzero(fused[14:]) == 0


def test_a_split_tensor_is_cast_after_every_read_of_it(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """CPU path, reads finishing last-first: the cast must wait for the tensor's every piece."""
    from warmgate.server.runner import weight_stream

    source = torch.randn(64, 33, generator=torch.Generator().manual_seed(2))  # float32 file
    path = _save(tmp_path, {"w": source})
    real = weight_stream._read_into

    def late_for_early_offsets(read: weight_stream._Read, buffer: memoryview,
                               wait: object) -> None:
        time.sleep(max(0.0, 0.3 - read.offset / 20_000))  # the first bytes arrive last
        real(read, buffer, None)

    monkeypatch.setattr(weight_stream, "_read_into", late_for_early_offsets)
    target = torch.zeros(64, 33, dtype=torch.bfloat16)
    stream_into([(path, read_header(path)["w"], target)], torch.device("cpu"), slice_bytes=512,
                num_readers=8, staged=False)
    assert torch.equal(target, source.to(torch.bfloat16))


def test_a_truncated_file_names_the_file(tmp_path: Path) -> None:
    path = _save(tmp_path, {"w": torch.ones(64, 64)})
    entry = read_header(path)["w"]
    path.write_bytes(path.read_bytes()[:-100])
    # Refused from the header at start-up, and by the reader if it shrank after that check.
    with pytest.raises(ModelLoadError, match="truncated"):
        read_header(path)
    with pytest.raises(ModelLoadError, match="truncated"):
        stream_into([(path, entry, torch.zeros(64, 64))], torch.device("cpu"))


def test_a_header_whose_sizes_disagree_is_refused(tmp_path: Path) -> None:
    path = _save(tmp_path, {"w": torch.ones(4, 4)})
    entry = read_header(path)["w"]
    bad = type(entry)(entry.name, "BF16", entry.shape, entry.begin, entry.end)
    with pytest.raises(ModelLoadError, match="corrupt"):
        stream_into([(path, bad, torch.zeros(4, 4, dtype=torch.bfloat16))], torch.device("cpu"))


def test_an_unknown_dtype_is_named(tmp_path: Path) -> None:
    path = _save(tmp_path, {"w": torch.ones(4)})
    entry = read_header(path)["w"]
    bad = type(entry)(entry.name, "F4_E2M1", entry.shape, entry.begin, entry.end)
    with pytest.raises(ModelLoadError, match="F4_E2M1"):
        stream_into([(path, bad, torch.zeros(4))], torch.device("cpu"))


def test_not_a_safetensors_file(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    path.write_bytes(b"\x05")
    with pytest.raises(ModelLoadError, match="not a readable safetensors file"):
        read_header(path)
