"""main runs the start-up's imports and configuration checks with the garbage collector off,
then freezes what they built and turns it back on before the model load; leaving main hands
the frozen objects back to the collector."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any

import pytest

from warmgate.server import main as server_main
from warmgate.server import prewarm
from warmgate.server.control.import_collection import collector_off_for_imports


@pytest.fixture(autouse=True)
def collector_restored() -> Iterator[None]:
    was = gc.isenabled()
    yield
    gc.unfreeze()
    if was:
        gc.enable()


def test_off_until_the_imports_are_done_then_frozen_and_on() -> None:
    assert gc.isenabled()
    with collector_off_for_imports() as imports_done:
        assert not gc.isenabled()
        imports_done()
        assert gc.isenabled() and gc.get_freeze_count() > 0
        imports_done()  # once is enough; a second call changes nothing
        assert gc.isenabled()
    assert gc.isenabled() and gc.get_freeze_count() == 0


def test_a_start_up_that_fails_before_its_imports_end_turns_it_back_on() -> None:
    with pytest.raises(SystemExit), collector_off_for_imports():
        raise SystemExit(2)
    assert gc.isenabled() and gc.get_freeze_count() == 0


def test_main_checks_the_configuration_with_it_off_and_loads_the_model_with_it_on(
        monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}
    load_config = server_main.load_server_config

    def config(argv: Any) -> Any:
        seen["checks"] = gc.isenabled()
        return load_config(argv)

    def warmup(config: Any) -> int:
        seen["load"] = (gc.isenabled(), gc.get_freeze_count())
        return 0

    monkeypatch.setattr(server_main, "load_server_config", config)
    monkeypatch.setattr(prewarm, "run_warmup_only", warmup)
    assert server_main.main(["--model", "tiny", "--device", "cpu", "--warmup-only"]) == 0
    enabled, frozen = seen["load"]
    assert seen["checks"] is False and enabled and frozen > 0
    assert gc.isenabled() and gc.get_freeze_count() == 0
