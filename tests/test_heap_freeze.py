"""After a successful warmup each serving process collects once and freezes what is left,
before readiness turns SERVING, so the first full collection after ready does not walk the
warmup's objects during the first requests; a warmup hands the last freeze back first (the
graphs it replaces may sit in cycles, which frozen are never collected)."""

from __future__ import annotations

import gc
import re
from collections.abc import Iterator
from typing import Any

import pytest

from tests.grpc_harness import FakeEngine, run, server_config, serving
from warmgate.client.api import WaitResult, WarmgateClient
from warmgate.server import app
from warmgate.server.control import heap_freeze
from warmgate.server.control.heap_freeze import HeapFreeze
from warmgate.server.core.progress import ProgressCallback
from warmgate.server.core.results import WarmupReport
from warmgate.server.devtools.server_process import ServerProcess

FROZEN_LINE = r"{}: heap frozen after warmup: \d+ objects collected, \d+ frozen in [\d.]+ ms"


@pytest.fixture(autouse=True)
def nothing_frozen() -> Iterator[None]:
    """Each test starts and ends with an empty permanent generation (as pytest has it)."""
    heap_freeze.thaw_warm_heap()
    gc.unfreeze()
    yield
    heap_freeze.thaw_warm_heap()
    gc.unfreeze()


def test_the_in_process_server_freezes_the_warmups_objects_before_it_turns_serving(
        monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[str, bool]] = []
    freeze = heap_freeze.freeze_warm_heap

    def recorded(process: str, runner: object | None = None) -> HeapFreeze:
        seen.append((process, running.controller.serving))
        return freeze(process, runner)

    monkeypatch.setattr(app, "freeze_warm_heap", recorded)

    config = server_config()
    engine = app.local_engine(config)

    async def body() -> None:
        nonlocal running
        async with serving(config, engine) as running:
            await running.controller.warmup_kernels()
            assert running.controller.serving
            runner = engine.runner
            tracked = gc.get_objects()
            # The runner the load built sits in the permanent generation: no collection
            # walks it again; what the collector still walks is a sliver of what is frozen.
            assert gc.is_tracked(runner) and not any(o is runner for o in tracked)
            assert len(tracked) * 20 < gc.get_freeze_count(), (len(tracked),
                                                                gc.get_freeze_count())
        assert gc.get_freeze_count() == 0  # stop() handed it back to this process

    running: Any = None
    run(body(), 300)
    assert seen == [("server", False)]  # once, and before readiness turned SERVING


class _RecordingEngine(FakeEngine):
    """Writes down the permanent generation's size as each warmup starts."""

    def __init__(self) -> None:
        super().__init__()
        self.frozen_at_start: list[tuple[str, int]] = []

    def run_plan(self, *, mixed_num_tokens: int | None, force: bool,
                 progress: ProgressCallback) -> WarmupReport:
        self.frozen_at_start.append(("plan", gc.get_freeze_count()))
        return super().run_plan(mixed_num_tokens=mixed_num_tokens, force=force,
                                progress=progress)

    def run_mixed(self, num_tokens: int, *, progress: ProgressCallback) -> WarmupReport:
        self.frozen_at_start.append(("mixed", gc.get_freeze_count()))
        return super().run_mixed(num_tokens, progress=progress)


def test_a_warmup_hands_the_last_warmups_freeze_back_first_and_freezes_again() -> None:
    engine = _RecordingEngine()

    async def body() -> None:
        async with serving(server_config(), engine) as running:
            controller = running.controller
            await controller.warmup_kernels()
            after_first = gc.get_freeze_count()
            await controller.warmup_kernels(force=True)
            after_forced = gc.get_freeze_count()
            await controller.mixed_warmup(8)
            assert controller.serving and gc.get_freeze_count() > 0
            assert after_first > 0 and after_forced > 0

    gc.freeze()  # what main froze after the imports
    imports = gc.get_freeze_count()
    run(body())
    plan, forced, mixed = engine.frozen_at_start
    # The first warmup keeps the imports' freeze (less what refcounting freed since); the
    # later ones start with nothing frozen.
    assert plan[0] == "plan" and plan[1] > imports * 0.9 > 0
    assert forced == ("plan", 0) and mixed == ("mixed", 0)


def test_the_engine_process_freezes_its_heap_before_the_server_turns_serving() -> None:
    with ServerProcess() as p, WarmgateClient(p.target, timeout=120) as client:
        assert client.wait_ready(120) is WaitResult.READY
        log = p.log()
    engine = re.search(r"\[engine\] .*" + FROZEN_LINE.format("engine"), log)
    server = re.search(FROZEN_LINE.format("server"), log)
    ready = re.search(r"warmup outcome=SUCCEEDED", log)
    assert engine is not None and server is not None and ready is not None, log
    # The engine freezes before its reply, the server before SERVING (then the outcome line).
    assert engine.start() < server.start() < ready.start(), log
