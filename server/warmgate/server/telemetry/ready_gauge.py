"""`warmgate_ready` as a readiness listener (warmgate.server.control.readiness)."""

from __future__ import annotations

from warmgate.server.telemetry.metrics import Metrics


class ReadyGauge:
    """1 while the server is SERVING, else 0; 0 for good once the device is lost."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    async def serving_changed(self, serving: bool) -> None:
        self._metrics.ready.set(1 if serving else 0)

    async def device_lost(self) -> None:
        self._metrics.ready.set(0)
