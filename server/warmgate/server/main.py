"""`warmgate-server`: load the model, serve Warmup/health/metrics, warm up in the background.

On SIGINT/SIGTERM health turns NOT_SERVING first (a readiness probe then drains the pod), the
warmup in progress is told to stop at its next step, and in-flight RPCs get
`--shutdown-grace` seconds before they are cancelled.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from collections.abc import Sequence

from warmgate.server.app import create_server
from warmgate.server.server_config import ServerConfig, configure_logging, load_server_config

logger = logging.getLogger(__name__)


async def serve(config: ServerConfig) -> None:
    running = await create_server(config)
    if running.metrics_port is not None:
        logger.info("metrics on port %d", running.metrics_port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    logger.info("stopping: health NOT_SERVING, %.1f s grace for in-flight RPCs",
                config.shutdown_grace_s)
    await running.stop(config.shutdown_grace_s)
    logger.info("stopped")


def main(argv: Sequence[str] | None = None) -> int:
    config = load_server_config(sys.argv[1:] if argv is None else argv)
    configure_logging(config)
    logger.info("config_hash=%s runner=%s", config.runner.config_hash(), config.runner.to_dict())
    asyncio.run(serve(config))
    return 0


if __name__ == "__main__":
    sys.exit(main())
