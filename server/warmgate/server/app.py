"""Assemble a server: Warmup, health, reflection, metrics. Separate from main's serve().

Tests call `create_server` with port 0 and a fake or real engine; `warmgate-server` calls it
from main.serve(), which adds signals and logging.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio
from grpc_reflection.v1alpha import reflection

from warmgate.server.config import RunnerConfig
from warmgate.server.controller import WarmupController
from warmgate.server.engine import PlanEngine, WarmupEngine
from warmgate.server.interceptor import ErrorInterceptor
from warmgate.server.metrics import Metrics, MetricsEndpoint
from warmgate.server.server_config import ServerConfig
from warmgate.server.service import WarmupService
from warmgate.server.status import Identity
from warmgate.v1 import warmup_pb2, warmup_pb2_grpc

logger = logging.getLogger(__name__)

LIVENESS_SERVICE = "liveness"


@dataclass
class RunningServer:
    server: grpc.aio.Server
    port: int
    controller: WarmupController
    health: health_aio.HealthServicer
    metrics: Metrics
    metrics_endpoint: MetricsEndpoint | None

    @property
    def metrics_port(self) -> int | None:
        return self.metrics_endpoint.port if self.metrics_endpoint else None

    async def stop(self, grace: float | None = None, *, wait_for_runner: bool = False) -> None:
        """NOT_SERVING first (so probes drain traffic), then stop RPCs, then the runner."""
        await self.health.enter_graceful_shutdown()
        await self.controller.close(wait=wait_for_runner)
        await self.server.stop(grace)
        if self.metrics_endpoint is not None:
            self.metrics_endpoint.close()


def identity_of(config: RunnerConfig) -> Identity:
    return Identity(config_hash=config.config_hash(), model=config.model.name,
                    device=config.device.device, attention_backend=config.device.attention_backend)


async def create_server(config: ServerConfig, *, engine: WarmupEngine | None = None
                        ) -> RunningServer:
    """Bind, register every service and start; warmup (if configured) starts in background.

    `engine` defaults to the real runner driven by the warmup plan.
    """
    metrics = Metrics()
    health = health_aio.HealthServicer()
    controller = WarmupController(
        engine if engine is not None else PlanEngine(config.runner),
        identity_of(config.runner),
        max_num_batched_tokens=config.runner.scheduler.max_num_batched_tokens,
        default_mixed_num_tokens=config.mixed_num_tokens, health=health, metrics=metrics)
    # so_reuseport 0: otherwise a second server silently binds the same port and shares it.
    server = grpc.aio.server(interceptors=[ErrorInterceptor(metrics)],
                             options=[("grpc.so_reuseport", 0)])
    warmup_pb2_grpc.add_WarmupServicer_to_server(WarmupService(controller), server)
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    reflection.enable_server_reflection((
        warmup_pb2.DESCRIPTOR.services_by_name["Warmup"].full_name,
        health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
        reflection.SERVICE_NAME), server)
    port = server.add_insecure_port(f"{config.host}:{config.port}")
    if port == 0:
        raise OSError(f"could not bind {config.host}:{config.port}")
    endpoint = (MetricsEndpoint(metrics, config.host, config.metrics_port)
                if config.metrics_enabled else None)
    # NOT_SERVING before the first RPC can arrive: HealthServicer starts "" at SERVING.
    await controller.start(warmup_on_start=config.warmup_on_start)
    # The liveness probe's service: SERVING while the process answers, whatever warmup does,
    # so a pod is never restarted (losing every compiled kernel) for being slow to warm.
    await health.set(LIVENESS_SERVICE, health_pb2.HealthCheckResponse.SERVING)
    await server.start()
    logger.info("serving warmgate.v1.Warmup on %s:%d (model %s, %s, %s attention)",
                config.host, port, config.runner.model.name, config.runner.device.device,
                config.runner.device.attention_backend)
    return RunningServer(server, port, controller, health, metrics, endpoint)
