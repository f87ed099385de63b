"""Readiness and its listeners: gRPC health and the ready gauge follow it, in order, and a
lost device ends readiness for good."""

from __future__ import annotations

import asyncio
import logging

import pytest

from tests.grpc_harness import run
from warmgate.server.api.health import (
    LIVENESS_SERVICE,
    NOT_SERVING,
    READINESS_SERVICES,
    SERVING,
    HealthListener,
    WarmgateHealth,
)
from warmgate.server.control.readiness import Readiness
from warmgate.server.control.status import Identity, StatusTracker, WarmupState
from warmgate.server.core.failures import FatalDeviceError
from warmgate.server.telemetry.metrics import Metrics
from warmgate.server.telemetry.ready_gauge import ReadyGauge

IDENTITY = Identity("hash", "tiny", "cpu", "torch")


class Recorder:
    """A listener that writes down what it heard, under its name."""

    def __init__(self, name: str, heard: list[str]) -> None:
        self._name, self._heard = name, heard

    async def serving_changed(self, serving: bool) -> None:
        self._heard.append(f"{self._name}:{'SERVING' if serving else 'NOT_SERVING'}")

    async def device_lost(self) -> None:
        self._heard.append(f"{self._name}:lost")


def _readiness(*listeners: object, metrics: Metrics | None = None
               ) -> tuple[Readiness, StatusTracker, set[asyncio.Task[None]]]:
    tracker = StatusTracker(IDENTITY)
    tasks: set[asyncio.Task[None]] = set()
    readiness = Readiness(tracker, lambda coro: tasks.add(asyncio.ensure_future(coro)),
                          listeners=listeners, metrics=metrics)  # type: ignore[arg-type]
    return readiness, tracker, tasks


def test_health_listener_turns_the_readiness_services_serving_and_back() -> None:
    async def go() -> None:
        health = WarmgateHealth()
        await health.set(LIVENESS_SERVICE, SERVING)
        listener = HealthListener(health)
        await listener.serving_changed(False)
        assert {n: health.statuses()[n] for n in READINESS_SERVICES} == \
            dict.fromkeys(READINESS_SERVICES, NOT_SERVING)
        await listener.serving_changed(True)
        assert {n: health.statuses()[n] for n in READINESS_SERVICES} == \
            dict.fromkeys(READINESS_SERVICES, SERVING)
        await listener.serving_changed(False)
        assert {n: health.statuses()[n] for n in READINESS_SERVICES} == \
            dict.fromkeys(READINESS_SERVICES, NOT_SERVING)
        assert health.statuses()[LIVENESS_SERVICE] == SERVING  # readiness never moves it
    run(go())


def test_health_listener_device_lost_is_not_serving_for_good_liveness_included() -> None:
    async def go() -> None:
        health = WarmgateHealth()
        await health.set(LIVENESS_SERVICE, SERVING)
        listener = HealthListener(health)
        await listener.serving_changed(True)
        await listener.device_lost()
        await listener.serving_changed(True)  # nothing turns it back
        assert set(health.statuses().values()) == {NOT_SERVING}
        assert set(health.statuses()) == {*READINESS_SERVICES, LIVENESS_SERVICE}
    run(go())


def test_ready_gauge_follows_readiness_and_is_zero_once_the_device_is_lost() -> None:
    async def go() -> None:
        metrics = Metrics()
        gauge = ReadyGauge(metrics)
        await gauge.serving_changed(True)
        assert metrics.ready._value.get() == 1
        await gauge.serving_changed(False)
        assert metrics.ready._value.get() == 0
        await gauge.serving_changed(True)
        await gauge.device_lost()
        assert metrics.ready._value.get() == 0
    run(go())


def test_listeners_hear_each_change_in_order_after_the_ready_hooks(
        caplog: pytest.LogCaptureFixture) -> None:
    heard: list[str] = []

    def broken_hook() -> None:
        raise RuntimeError("no pool today")

    async def go() -> None:
        readiness, _, _ = _readiness(Recorder("health", heard), Recorder("gauge", heard))
        readiness.add_ready_hook(lambda: heard.append("hook"))
        readiness.add_ready_hook(broken_hook)
        await readiness.set_serving(True)
        assert readiness.serving
        await readiness.set_serving(False)
        assert not readiness.serving
    with caplog.at_level(logging.ERROR):
        run(go())
    assert heard == ["hook", "health:SERVING", "gauge:SERVING",
                     "health:NOT_SERVING", "gauge:NOT_SERVING"]
    assert "a ready listener failed" in caplog.text  # logged, and readiness went on


def test_lose_fails_the_state_and_turns_not_serving_keeping_the_first_reason() -> None:
    heard: list[str] = []

    async def go() -> None:
        readiness, tracker, tasks = _readiness(Recorder("health", heard))
        readiness.add_lost_hook(lambda: heard.append("forget"))
        await readiness.set_serving(True)
        readiness.lose("a compile after ready")
        readiness.lose("a second reason")  # the first stands
        await asyncio.gather(*tasks)
        assert tracker.state is WarmupState.FAILED
        assert tracker.snapshot().failure_reason == "a compile after ready"
        assert not readiness.serving
        assert readiness.fatal_error is None  # not fatal: a forced warmup can recover
    run(go())
    assert heard == ["health:SERVING", "forget", "health:NOT_SERVING"]


def test_device_lost_is_reported_once_and_wakes_wait_fatal() -> None:
    heard: list[str] = []

    async def go() -> None:
        readiness, tracker, _ = _readiness(Recorder("health", heard))
        waiter = asyncio.ensure_future(readiness.wait_fatal())
        first = FatalDeviceError("decode", RuntimeError("CUDA error: an illegal memory access"))
        assert await readiness.device_lost(first)
        assert not await readiness.device_lost(FatalDeviceError("rpc", RuntimeError("again")))
        assert await asyncio.wait_for(waiter, 5) is first
        assert readiness.fatal_error is first
        assert tracker.state is WarmupState.FAILED
        assert "illegal memory access" in tracker.snapshot().failure_reason
        readiness.lose("later")  # no effect after a fatal error
        assert "illegal memory access" in tracker.snapshot().failure_reason
    run(go())
    assert heard == ["health:lost"]
