"""A step's inputs go to the device in one copy, padded on the host to the shape its graph
replays (runner/step_staging.py): the regions' layout, the one copy, and padding that
changes nothing a request sees."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tests.runner_helpers import MiniScheduler, make_runner, prompt
from warmgate.server.runner.input_batch import StepInputs
from warmgate.server.runner.model_runner import ModelRunner
from warmgate.server.runner.step_shape import RAGGED, UNIFORM, StepShape
from warmgate.server.runner.step_staging import StepStaging, StepViews

REGIONS = ("input_ids", "positions", "slot_mapping", "logits_indices", "query_start_loc",
           "seq_lens", "block_table", "pending")


def _spans(views: StepViews, base: int, side: str = "gpu") -> list[tuple[int, int]]:
    spans = []
    for name in REGIONS:
        t = getattr(getattr(views, name), side)
        start = t.data_ptr() - base
        spans.append((start, start + t.numel() * t.element_size()))
    return spans


@pytest.mark.parametrize(("tokens", "reqs"), [(1, 1), (7, 3), (64, 64), (256, 8)])
def test_regions_are_aligned_apart_and_inside_the_shapes_bytes(tokens: int, reqs: int) -> None:
    staging = StepStaging(256, 64, 32, torch.device("cpu"))
    views = staging.views(tokens, reqs)
    spans = _spans(views, staging.gpu.data_ptr())
    assert all(start % 256 == 0 for start, _ in spans)  # Triton's alignment specialization
    assert all(end <= nxt for (_, end), (nxt, _) in itertools.pairwise(spans))
    assert spans[-1][1] <= views.nbytes <= staging.gpu.numel()
    host = _spans(views, staging.host.data_ptr(), "cpu")
    assert host == spans  # the host buffer has the same layout: one copy moves every region


def test_a_shapes_views_keep_their_addresses() -> None:
    """What a CUDA graph captured on a shape's views relies on, even after the cache of
    eager shapes was emptied."""
    staging = StepStaging(256, 64, 32, torch.device("cpu"))
    first = [getattr(staging.views(16, 4), name).gpu.data_ptr() for name in REGIONS]
    for tokens in range(1, 257):  # past the cache's size: it is emptied
        for reqs in (1, 2, 3):
            staging.views(tokens, reqs)
    assert [getattr(staging.views(16, 4), name).gpu.data_ptr() for name in REGIONS] == first


def test_a_shape_past_the_buffers_is_refused() -> None:
    staging = StepStaging(256, 64, 32, torch.device("cpu"))
    with pytest.raises(ValueError, match="past the buffers"):
        staging.views(257, 1)


class _Writes(TorchDispatchMode):
    """Every in-place op (copy_, zero_, fill_, ...) run inside."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None
                           ) -> Any:
        name = func.overloadpacket.__name__
        if name.endswith("_"):
            self.ops.append(name)
        return func(*args, **(kwargs or {}))


def _staged_steps(runner: ModelRunner, writes: _Writes | None = None) -> list[StepInputs]:
    """Spy on prepare_inputs (inside `writes` when given): every step's inputs."""
    prepare = runner.input_batch.prepare_inputs
    seen: list[StepInputs] = []

    def spy(scheduled: Any, shape_for: Any = None) -> StepInputs:
        if writes is None:
            seen.append(prepare(scheduled, shape_for))
        else:
            with writes:
                seen.append(prepare(scheduled, shape_for))
        return seen[-1]

    runner.input_batch.prepare_inputs = spy  # type: ignore[method-assign]
    return seen


def _pad_to(runner: ModelRunner, kind: str, tokens: int, reqs: int) -> None:
    """The runner pads every step as a graph of (kind, tokens, reqs) would (no GPU here: the
    padded shape runs eagerly)."""
    runner._shape_for = lambda r, t, u: StepShape(kind, tokens, reqs)  # type: ignore[method-assign]


def _traffic(runner: ModelRunner) -> list[torch.Tensor]:
    """Two prompts, then two decodes of both: each step's logits."""
    sched = MiniScheduler(runner)
    sched.add("a", prompt(9))
    sched.add("b", prompt(5, offset=4))
    logits = []
    for _ in range(3):
        sched.step()
        assert runner.last_logits is not None
        logits.append(runner.last_logits.clone())
    return logits


def test_a_step_is_one_copy_to_the_device_padding_included() -> None:
    runner = make_runner(max_num_seqs=4)
    writes = _Writes()
    steps = _staged_steps(runner, writes)
    _pad_to(runner, RAGGED, 32, 4)
    _traffic(runner)
    assert len(steps) == 3
    assert writes.ops == ["copy_"] * 3  # nothing else writes a device tensor


def _four_then_two(runner: ModelRunner, shape: StepShape | None = None) -> list[torch.Tensor]:
    """Four prompts, a decode of all four (padded to `shape` from there on when given), then
    two of them finish and the other two decode twice: each decode's logits. The padded
    rows of the last steps held the finished requests' numbers before."""
    sched = MiniScheduler(runner)
    for i, n in enumerate((9, 5, 7, 6)):
        sched.add(f"r{i}", prompt(n, offset=4 * i))
    sched.step()
    if shape is not None:
        _pad_to(runner, shape.kind, shape.num_tokens, shape.num_reqs)
    logits = []
    for step in range(3):
        if step == 1:
            sched.finish("r2")
            sched.finish("r3")
        sched.step()
        assert runner.last_logits is not None
        logits.append(runner.last_logits.clone())
    return logits


def test_a_uniform_graphs_padding_is_a_request_on_the_null_block() -> None:
    runner = make_runner(max_num_seqs=4)
    q = runner.decode_query_len
    steps = _staged_steps(runner)
    expected = _four_then_two(make_runner(max_num_seqs=4))
    got = _four_then_two(runner, StepShape(UNIFORM, 4 * q, 4))
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    views = steps[-1].views
    assert views.query_start_loc.gpu.tolist() == [0, q, 2 * q, 3 * q, 4 * q]
    assert views.seq_lens.gpu[2:].tolist() == [q, q]
    assert not views.block_table.gpu[2:].any()
    for name in ("input_ids", "positions", "slot_mapping"):
        assert not getattr(views, name).gpu[2 * q:].any()  # token 0 at slot 0: null block


def test_a_ragged_graphs_padding_is_requests_of_no_tokens() -> None:
    runner = make_runner(max_num_seqs=4)
    steps = _staged_steps(runner)
    expected = _four_then_two(make_runner(max_num_seqs=4))
    got = _four_then_two(runner, StepShape(RAGGED, 32, 4))
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    views = steps[-1].views  # two requests decode: a token each
    assert views.query_start_loc.gpu.tolist() == [0, 1, 2, 2, 2]
    assert views.seq_lens.gpu[2:].tolist() == [0, 0]
    assert not views.block_table.gpu[2:].any()
    for name in ("input_ids", "positions", "slot_mapping"):
        assert not getattr(views, name).gpu[2:].any()
