"""Assemble a server: Warmup, health, reflection, metrics. Separate from main's serve().

Tests call `create_server` with port 0 and a fake or real engine; `warmgate-server` calls it
from main.serve(), which adds signals and logging.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from warmgate.server.api.auth import AuthInterceptor
from warmgate.server.api.generation import GenerationService
from warmgate.server.api.grpc_options import SERVER_OPTIONS
from warmgate.server.api.health import LIVENESS_SERVICE, HealthListener, WarmgateHealth
from warmgate.server.api.health_link import HealthLink, start_health_link
from warmgate.server.api.interceptor import ErrorInterceptor
from warmgate.server.api.security import server_credentials
from warmgate.server.api.service import WarmupService
from warmgate.server.cache.store import compile_cache_of
from warmgate.server.config.listen_address import grpc_address
from warmgate.server.config.runner_config import RunnerConfig
from warmgate.server.config.security import ServerSecurity
from warmgate.server.config.server_config import ServerConfig
from warmgate.server.control.controller import WarmupController
from warmgate.server.control.engine import PlanEngine, WarmupEngine
from warmgate.server.control.faults import FaultInjector
from warmgate.server.control.heap_freeze import freeze_warm_heap, thaw_warm_heap
from warmgate.server.control.remote_engine import RemoteEngine
from warmgate.server.control.status import Identity
from warmgate.server.core.failures import FatalDeviceError
from warmgate.server.jit import JitMonitor
from warmgate.server.telemetry.metrics import Metrics
from warmgate.server.telemetry.metrics_endpoint import MetricsEndpoint
from warmgate.server.telemetry.ready_gauge import ReadyGauge
from warmgate.server.text.model_text import ModelText, load_model_text
from warmgate.v1 import generate_pb2, generate_pb2_grpc, warmup_pb2, warmup_pb2_grpc

logger = logging.getLogger(__name__)


@dataclass
class RunningServer:
    server: grpc.aio.Server
    port: int
    controller: WarmupController
    health: WarmgateHealth
    metrics: Metrics
    metrics_endpoint: MetricsEndpoint | None
    generation: GenerationService
    # The health process serving --health-port (api/health_process.py), if any.
    health_link: HealthLink | None = None
    # The engine's JIT monitor, whose process-wide compiler hooks stop() removes.
    jit_monitor: JitMonitor | None = None
    # create_server started the health process (no caller handed one in): stop() ends it.
    owns_health_link: bool = False
    heartbeat: asyncio.Future[None] | None = None
    # --engine-process: the engine process, which stop() ends after the drain.
    engine_process: RemoteEngine | None = None

    @property
    def health_port(self) -> int | None:
        return self.health_link.port if self.health_link else None

    @property
    def metrics_port(self) -> int | None:
        return self.metrics_endpoint.port if self.metrics_endpoint else None

    async def stop(self, grace: float | None = None, *, wait_for_runner: bool = False) -> None:
        """Readiness NOT_SERVING first (so probes drain traffic), then stop RPCs, then the
        runner. Liveness stays SERVING until the process exits (a failed liveness probe would
        get the draining pod restarted).

        The health port goes last: while the main port drains, probes there still get an
        answer rather than a refused connection. A health process main.py handed in lives on
        until the process exits (liveness SERVING to the end); one create_server started
        ends here.
        """
        await self.health.drain()
        self.controller.begin_drain()  # warmups would preempt the streams being drained
        start = time.monotonic()
        # Generate streams get the grace to finish before the runner stops under them.
        await self.generation.drain(grace or 0.0)
        await self.controller.close(wait=self.engine_process is None and wait_for_runner)
        if self.engine_process is not None:
            # The step in flight gets what is left of the grace, as in one process; then the
            # engine's end of file wakes the worker waiting on it.
            self.engine_process.cancel()
            left = (grace or 0.0) - (time.monotonic() - start)
            await self.controller.wait_runner_idle(max(0.0, left))
            await asyncio.to_thread(self.engine_process.close)
            await self.controller.close(wait=wait_for_runner)
        await self.server.stop(None if grace is None
                               else max(0.0, grace - (time.monotonic() - start)))
        if self.health_link is not None and self.owns_health_link:
            if self.heartbeat is not None:
                self.heartbeat.cancel()
            self.health_link.close()
        if self.metrics_endpoint is not None:
            self.metrics_endpoint.close()
        if self.jit_monitor is not None:
            self.jit_monitor.close()
        # The warmup's freeze back to the collector: a caller in this process (a test) that
        # drops the server gets its cycles collected.
        thaw_warm_heap()


def identity_of(config: RunnerConfig) -> Identity:
    return Identity(config_hash=config.config_hash(), model=config.model.name,
                    device=config.device.device, attention_backend=config.device.attention_backend,
                    deterministic=config.numerics.deterministic)


def _bind(server: grpc.aio.Server, host: str, port: int, security: ServerSecurity | None
          ) -> int:
    address = grpc_address(host, port)
    if security is not None and security.tls:
        bound = server.add_secure_port(address, server_credentials(security))
    else:
        bound = server.add_insecure_port(address)
    if bound == 0:
        raise OSError(f"could not bind {address}")
    return bound


def _default_engine(config: ServerConfig, text: ModelText) -> PlanEngine | RemoteEngine:
    if config.engine_process:
        return RemoteEngine.start(config, text)
    return local_engine(config, text)


def local_engine(config: ServerConfig, text: ModelText | None = None) -> PlanEngine:
    """The runner and plan in this process; `text`: the model's text files as loaded at
    start-up (None: the warmup reads them)."""
    faults = FaultInjector(config.faults) if config.faults else None
    if faults is not None:
        logger.warning("FAULT INJECTION ON (test only): %s", config.faults)
    return PlanEngine(config.runner, faults=faults, cache=compile_cache_of(config), text=text)


def _threadsafe(fn: Callable[[FatalDeviceError], Coroutine[Any, Any, None]],
                loop: asyncio.AbstractEventLoop) -> Callable[[FatalDeviceError], None]:
    """fn(exc) scheduled on `loop` from another thread, without waiting for it."""
    def call(exc: FatalDeviceError) -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed: the server is gone
            asyncio.run_coroutine_threadsafe(fn(exc), loop)

    return call


def describe_security(security: ServerSecurity) -> str:
    """The main port's security for the start-up line. Without tokens that line also says
    what anyone who reaches the port may do: force a warmup, which preempts every stream and
    turns health NOT_SERVING while it runs (deploy/README.md, "Who may start a warmup")."""
    tls = ("mTLS" if security.tls_client_ca else "TLS") if security.tls else "plaintext"
    if security.auth:
        return f"{tls}, bearer token auth"
    return (f"{tls}, no auth: any client may force a warmup (WarmupKernels with force, "
            "MixedWarmup), which preempts every stream and turns health NOT_SERVING while it "
            "runs; --auth-token-file restricts them")


async def create_server(config: ServerConfig, *, engine: WarmupEngine | None = None,
                        text: ModelText | None = None, health_link: HealthLink | None = None
                        ) -> RunningServer:
    """Bind, register every service and start; warmup (if configured) starts in background.

    `engine` defaults to the real runner driven by the warmup plan; `text` to the model
    directory's tokenizer files, read here (main reads them earlier, before logging starts,
    so that an unusable one is a single line). `health_link`: the health process main
    started for --health-port; without one, create_server starts it (and stop() ends it).
    """
    # Before anything binds: an unusable tokenizer or chat template fails the start-up.
    text = text if text is not None else load_model_text(config.runner.model, config.serving)
    metrics = Metrics(config.runner.parallel.tensor_parallel_size,
                      deterministic=config.runner.numerics.deterministic)
    health = WarmgateHealth(max_watchers=config.max_health_watchers)
    engine = engine if engine is not None else _default_engine(config, text)
    # Fakes in tests have none; the real engine's counts every compile of its runner.
    jit_monitor = engine.jit_monitor
    if jit_monitor is not None:
        jit_monitor.add_listener(metrics.observe_jit)
    controller = WarmupController(
        engine, identity_of(config.runner),
        max_num_batched_tokens=config.runner.scheduler.max_num_batched_tokens,
        default_mixed_num_tokens=config.mixed_num_tokens,
        listeners=(HealthListener(health), ReadyGauge(metrics)), metrics=metrics,
        jit_monitor=jit_monitor, strict_jit=config.strict_jit)
    # Error first, so it also counts (and maps) what the auth interceptor refuses.
    interceptors: list[grpc.aio.ServerInterceptor] = [
        ErrorInterceptor(metrics, on_fatal=controller.device_lost)]
    if config.security.auth:
        interceptors.append(AuthInterceptor(config.security.auth_tokens))
    server = grpc.aio.server(interceptors=interceptors, options=SERVER_OPTIONS)
    warmup_pb2_grpc.add_WarmupServicer_to_server(WarmupService(
        controller, max_watchers=config.max_status_watchers), server)
    generation = GenerationService(controller, engine, config.runner, config.serving,
                                   metrics.serving, text)
    generate_pb2_grpc.add_GenerationServicer_to_server(generation, server)
    controller.add_ready_listener(generation.prepare)
    controller.set_rehearsal(generation.rehearse)
    # Last, so what the hooks before it built (the KV block pool) is frozen too.
    controller.add_ready_listener(lambda: freeze_warm_heap("server", engine.runner))
    if config.warmup_on_start:  # ready follows the load: its import overlaps the warmup
        generation.launch_grammar_probes()
    if isinstance(engine, PlanEngine):  # a dead tensor-parallel worker ends the process
        loop = asyncio.get_running_loop()
        engine.on_fatal = lambda exc: asyncio.run_coroutine_threadsafe(
            controller.device_lost(exc), loop).result()
    elif isinstance(engine, RemoteEngine):  # so does a dead or hung engine process
        engine.on_fatal = _threadsafe(controller.device_lost, asyncio.get_running_loop())
        generation.build_grammar_backend_early()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    reflection.enable_server_reflection((
        warmup_pb2.DESCRIPTOR.services_by_name["Warmup"].full_name,
        generate_pb2.DESCRIPTOR.services_by_name["Generation"].full_name,
        health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
        reflection.SERVICE_NAME), server)
    port = _bind(server, config.host, config.port, config.security)
    if isinstance(engine, RemoteEngine):
        engine.launch()
    if config.security.auth and not config.security.tls:
        logger.warning("bearer tokens travel in plaintext on port %d: pass --tls-cert and "
                       "--tls-key unless the network is trusted", port)
    owns_link = health_link is None and config.health_port_enabled
    if owns_link:
        health_link = start_health_link(config.host, config.health_port,
                                        config.max_health_watchers)
    endpoint = (MetricsEndpoint(metrics, config.host, config.metrics_port,
                                max_connections=config.metrics_max_connections,
                                idle_timeout_s=config.metrics_idle_timeout_s)
                if config.metrics_enabled else None)
    # NOT_SERVING before the first RPC can arrive: HealthServicer starts "" at SERVING.
    await controller.start(warmup_on_start=config.warmup_on_start)
    # The liveness probe's service: SERVING while the process answers, whatever warmup does,
    # so a pod is never restarted (losing every compiled kernel) for being slow to warm.
    await health.set(LIVENESS_SERVICE, health_pb2.HealthCheckResponse.SERVING)
    heartbeat = None
    if health_link is not None:
        health_link.on_count = metrics.count_rpcs
        health.mirror_to(health_link.set)
        heartbeat = asyncio.ensure_future(health_link.heartbeat())
    await server.start()
    if health_link is not None:
        logger.info("serving grpc.health.v1 (plaintext) on %s:%d (health process %d)",
                    config.host, health_link.port, health_link.proc.pid)
    logger.info("serving warmgate.v1.Warmup on %s:%d (model %s, %s, %s attention; %s)",
                config.host, port, config.runner.model.name, config.runner.device.device,
                config.runner.device.attention_backend, describe_security(config.security))
    return RunningServer(server, port, controller, health, metrics, endpoint, generation,
                         health_link, jit_monitor, owns_link, heartbeat,
                         engine if isinstance(engine, RemoteEngine) else None)
