"""`warmgate-server`: load the model, serve Warmup/health/metrics, warm up in the background.

On SIGINT/SIGTERM health turns NOT_SERVING first (a readiness probe then drains the pod), the
warmup in progress is told to stop at its next step, in-flight RPCs get `--shutdown-grace`
seconds before they are cancelled, and the process exits 0.

On a fatal device error (a sticky CUDA error: the CUDA context is gone) health turns
NOT_SERVING for every service, the server stops the same way and the process exits 70, so
Kubernetes restarts the container instead of keeping a half-alive pod.

A configuration that can never serve (a bad flag, a busy port, a TLS key of another
certificate, ...) exits 2 before anything starts, with one line on stderr naming the flag.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, NoReturn

from warmgate.server.api.port_check import PortInUse, check_ports
from warmgate.server.config.flags import startup_error
from warmgate.server.config.server_config import ServerConfig, configure_logging
from warmgate.server.control.background_startup import (
    begin_background_startup,
    begin_cuda_context,
    context_device,
)
from warmgate.server.control.import_collection import collector_off_for_imports
from warmgate.server.cpu_threads import apply_cpu_threads
from warmgate.server.startup import load_server_config
from warmgate.server.text.errors import TextLoadError
from warmgate.server.text.model_text import ModelText, load_model_text

if TYPE_CHECKING:
    from warmgate.server.api.health_link import HealthLink

logger = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_FATAL = 70  # EX_SOFTWARE (sysexits.h); any non-zero code makes the kubelet restart us


def _exit_now(code: int) -> NoReturn:
    """Leave at once, after flushing the logs.

    For a runner step still going after the grace: Python cannot interrupt a thread, and
    interpreter exit would join it (the worker is no daemon: ThreadPoolExecutor's never
    are), which could outlast the pod's grace period. A grammar compile's daemon thread is
    not joined, but one that returns into a finalizing interpreter can abort the process.
    And before asyncio.run's teardown, which would cancel the RPCs still waiting on that
    step, each logged by grpc as an unhandled CancelledError: a stop is not an error.
    """
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _check_ports(config: ServerConfig, health_held: bool = False) -> None:
    """Exit 2 with one line naming the flag and the address if a configured port is busy
    (the health port not when our own health process holds it)."""
    try:
        check_ports(config.host, (
            ("--port", config.port),
            ("--health-port", config.health_port
             if config.health_port_enabled and not health_held else -1),
            ("--metrics-port", config.metrics_port if config.metrics_enabled else -1)))
    except PortInUse as exc:
        startup_error(str(exc))


async def serve(config: ServerConfig, text: ModelText | None = None,
                health: HealthLink | None = None) -> int:
    from warmgate.server.app import create_server  # after main's CUDA context started

    try:
        running = await create_server(config, text=text, health_link=health)
    except (OSError, RuntimeError):
        # grpc says RuntimeError, http.server OSError; a port taken since main's check gets
        # the same one line, anything else keeps its traceback.
        _check_ports(config, health_held=health is not None)
        raise
    if running.metrics_port is not None:
        logger.info("metrics on port %d", running.metrics_port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    signalled = asyncio.ensure_future(stop.wait())
    fatal = asyncio.ensure_future(running.controller.wait_fatal())
    await asyncio.wait({signalled, fatal}, return_when=asyncio.FIRST_COMPLETED)
    code = EXIT_FATAL if fatal.done() else EXIT_OK
    for task in (signalled, fatal):
        task.cancel()
    started = time.monotonic()
    logger.info("stopping (%s): health NOT_SERVING, %.1f s grace for in-flight RPCs",
                "fatal device error" if code == EXIT_FATAL else "signal",
                config.shutdown_grace_s)
    await running.stop(config.shutdown_grace_s)
    left = max(0.0, config.shutdown_grace_s - (time.monotonic() - started))
    idle = await running.controller.wait_runner_idle(left)
    if not idle:
        logger.warning("the runner is still inside a step after the grace; exiting without it")
    compiles = running.generation.num_compiles_running
    if compiles:
        logger.info("exiting without the %d grammar compiles still running", compiles)
    logger.info("stopped (exit code %d)", code)
    if not idle or compiles:
        _exit_now(code)
    return code


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    with collector_off_for_imports() as imports_done:
        config, text, health = _start(argv)
        imports_done()
        if config.warmup_only:
            from warmgate.server.prewarm import run_warmup_only

            return run_warmup_only(config)
        return asyncio.run(serve(config, text, health))


def _start(argv: Sequence[str]) -> tuple[ServerConfig, ModelText | None, HealthLink | None]:
    """Everything before the model load: the health process, torch and the CUDA context, the
    configuration, the weights' read-ahead, the tokenizer, logging."""
    # First of all the health process (api/health_process.py), from the flags alone: it
    # starts its own interpreter beside ours, and probes get NOT_SERVING from its bind on,
    # while the start-up checks and the model load go on.
    from warmgate.server.api.health_link import confirm_health_link, start_health_link_early

    pending_health = start_health_link_early(argv, os.environ)
    # Then import torch and start the CUDA context, which needs only --device; the rest of
    # the imports and the configuration checks run beside it. The weights' read-ahead follows
    # once the configuration names them; both run while the tokenizer loads and the servers
    # bind (warmgate.server.control.background_startup).
    background = begin_cuda_context(context_device(argv, os.environ))
    health = confirm_health_link(pending_health)
    config = load_server_config(argv)
    background = begin_background_startup(
        config.runner, background, cuda=config.warmup_only or not config.engine_process)
    text = None
    if not config.warmup_only:  # which binds nothing and serves no text
        _check_ports(config, health_held=health is not None)
        try:
            text = load_model_text(config.runner.model, config.serving)
        except TextLoadError as exc:
            startup_error(f"argument --model: {exc}")
    configure_logging(config)
    background.logging_ready()
    logger.info("config_hash=%s runner=%s", config.runner.config_hash(), config.runner.to_dict())
    apply_cpu_threads(config.cpu_threads, config.runner.device.device)
    return config, text, health


if __name__ == "__main__":
    sys.exit(main())
