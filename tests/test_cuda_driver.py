"""control/cuda_driver.py: the primary context made through the driver API, in order, and
every way it can fail reported as a reason (torch's initialisation then does the work)."""

from __future__ import annotations

import ctypes
from typing import Any

import pytest

from warmgate.server.control import background_startup, cuda_driver


class FakeDriver:
    """libcuda's three entry points, recording their calls; `fail` maps a name to a
    CUresult to return instead of 0."""

    def __init__(self, fail: dict[str, int] | None = None) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.fail = fail or {}

    def _result(self, name: str, arg: Any) -> int:
        self.calls.append((name, arg))
        return self.fail.get(name, 0)

    def cuInit(self, flags: int) -> int:
        return self._result("cuInit", flags)

    def cuDeviceGet(self, device: Any, ordinal: int) -> int:
        return self._result("cuDeviceGet", ordinal)

    def cuDevicePrimaryCtxRetain(self, context: Any, device: ctypes.c_int) -> int:
        return self._result("cuDevicePrimaryCtxRetain", device)


@pytest.mark.parametrize(("device", "ordinal"), [("cuda", 0), ("auto", 0), ("cuda:0", 0),
                                                 ("cuda:3", 3)])
def test_the_ordinal_of_a_device_flag(device: str, ordinal: int) -> None:
    assert cuda_driver.device_ordinal(device) == ordinal


def test_the_primary_context_is_retained_after_init_on_the_named_device() -> None:
    driver = FakeDriver()
    assert cuda_driver.retain_primary_context(2, load=lambda _: driver) is None
    assert [name for name, _ in driver.calls] == ["cuInit", "cuDeviceGet",
                                                  "cuDevicePrimaryCtxRetain"]
    assert driver.calls[0][1] == 0 and driver.calls[1][1] == 2


def test_a_failing_call_stops_there_and_says_which() -> None:
    driver = FakeDriver(fail={"cuDeviceGet": 101})  # CUDA_ERROR_INVALID_DEVICE
    assert (cuda_driver.retain_primary_context(7, load=lambda _: driver)
            == "cuDeviceGet returned CUresult 101")
    assert [name for name, _ in driver.calls] == ["cuInit", "cuDeviceGet"]


def test_no_driver_library_is_a_reason_not_an_error() -> None:
    def missing(name: str) -> ctypes.CDLL:
        raise OSError(f"{name}: cannot open shared object file")

    reason = cuda_driver.retain_primary_context(0, load=missing)
    assert reason is not None and reason.startswith("no CUDA driver library (libcuda.so.1")


def test_the_context_line_says_whether_the_driver_api_made_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch, "zeros", lambda *_args, **_kwargs: None)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *_args: None)
    monkeypatch.setattr(background_startup, "retain_primary_context", lambda _ordinal: None)
    line = background_startup.create_cuda_context("cuda:0")
    assert line.startswith("start-up: CUDA context on cuda:0 in ")
    assert "driver API" in line and "GIL released" in line
    monkeypatch.setattr(background_startup, "retain_primary_context",
                        lambda _ordinal: "cuInit returned CUresult 100")
    line = background_startup.create_cuda_context("cuda:0")
    assert "not through the driver API: cuInit returned CUresult 100" in line
