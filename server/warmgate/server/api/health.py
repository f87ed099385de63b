"""grpc.health.v1 as warmgate serves it: gRPC's asyncio HealthServicer plus List and a drain,
and HealthListener, which makes health follow the controller's readiness.

- List: the stock servicer leaves it to the generated base class, which raises
  NotImplementedError; the error interceptor then answered INTERNAL with a traceback on every
  call. Here it returns every registered service's status.
- drain (SIGTERM): the readiness services turn NOT_SERVING for good so traffic moves away,
  while `liveness` stays SERVING until the process exits: a kubelet that saw liveness fail
  would restart the pod and cut its grace short. A fatal device error still uses
  enter_graceful_shutdown, which turns every service, liveness included, NOT_SERVING.
- Watch: at most --max-health-watchers streams at once (core/stream_cap.py), as the health
  process caps its own.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

import grpc
from grpc_health.v1 import health_pb2
from grpc_health.v1.health import aio as health_aio

from warmgate.server.config.server_config import MAX_HEALTH_WATCHERS
from warmgate.server.core.errors import ResourceExhausted
from warmgate.server.core.stream_cap import health_watch_cap

logger = logging.getLogger(__name__)

LIVENESS_SERVICE = "liveness"
# The services readiness moves: "" is the whole server, as probes ask by default.
READINESS_SERVICES = ("", "warmgate.v1.Warmup")
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class WarmgateHealth(health_aio.HealthServicer):
    def __init__(self, live_through_drain: Iterable[str] = (LIVENESS_SERVICE,), *,
                 max_watchers: int = MAX_HEALTH_WATCHERS) -> None:
        super().__init__()
        self._live_through_drain = frozenset(live_through_drain)
        self._draining = False
        self._mirror: Callable[[str, int], None] | None = None
        self._watchers = health_watch_cap(max_watchers)

    async def Watch(self, request: health_pb2.HealthCheckRequest,
                    context: grpc.aio.ServicerContext[health_pb2.HealthCheckRequest,
                                                      health_pb2.HealthCheckResponse]
                    ) -> None:
        """The stock Watch, past --max-health-watchers open ones refused: a stream is
        unauthenticated (probes and load balancers speak no tokens) and was uncapped."""
        refusal = self._watchers.take()
        if refusal is not None:
            raise ResourceExhausted(refusal)
        try:
            await super().Watch(request, context)
        finally:
            self._watchers.release()

    def mirror_to(self, push: Callable[[str, int], None]) -> None:
        """From now on every status change also goes to `push` (the health process's table),
        starting with every current status."""
        self._mirror = push
        for name, status in self.statuses().items():
            push(name, int(status))

    async def _set(self, service: str,
                   status: health_pb2.HealthCheckResponse.ServingStatus.ValueType) -> None:
        # Every change goes through here: set, the drain and enter_graceful_shutdown.
        await super()._set(service, status)
        if self._mirror is not None:
            self._mirror(service, int(status))

    def statuses(self) -> dict[str, health_pb2.HealthCheckResponse.ServingStatus.ValueType]:
        """A snapshot of every registered service's status."""
        return dict(self._server_status)

    async def List(
            self, request: health_pb2.HealthListRequest,
            context: grpc.aio.ServicerContext[health_pb2.HealthListRequest,
                                              health_pb2.HealthListResponse],
    ) -> health_pb2.HealthListResponse:
        return health_pb2.HealthListResponse(statuses={
            name: health_pb2.HealthCheckResponse(status=status)
            for name, status in self.statuses().items()})

    async def set(self, service: str,
                  status: health_pb2.HealthCheckResponse.ServingStatus.ValueType) -> None:
        # During a drain nothing may turn readiness back (a warmup finishing meanwhile).
        if self._draining and service not in self._live_through_drain:
            return
        await super().set(service, status)

    async def drain(self) -> None:
        """Every service but the live-through-drain ones NOT_SERVING, until the process ends."""
        if self._draining:
            return
        self._draining = True
        stopped = [name for name in self.statuses() if name not in self._live_through_drain]
        for name in stopped:
            await super().set(name, NOT_SERVING)
        logger.info("health: %d services NOT_SERVING for the drain (%s); %s stay SERVING "
                    "until the process exits", len(stopped),
                    ", ".join(repr(n) for n in stopped),
                    ", ".join(sorted(self._live_through_drain)))


class HealthListener:
    """gRPC health as a readiness listener (warmgate.server.control.readiness): the
    readiness services follow SERVING/NOT_SERVING, and a lost device ends every service."""

    def __init__(self, health: WarmgateHealth,
                 services: Iterable[str] = READINESS_SERVICES) -> None:
        self._health = health
        self._services = tuple(services)

    async def serving_changed(self, serving: bool) -> None:
        status = SERVING if serving else NOT_SERVING
        for name in self._services:
            await self._health.set(name, status)  # a coroutine: un-awaited it does nothing

    async def device_lost(self) -> None:
        # After enter_graceful_shutdown no set() turns a service back, liveness included.
        await self._health.enter_graceful_shutdown()
