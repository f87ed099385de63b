"""The engine process: `python -m warmgate.server.engine_main --reply-fd F`, started by the
front (control/engine_client.py), never by hand.

A program at the top of the house, beside main.py and tp_worker.py: it runs the model
runner, the warmup plan and the serving loop (control/engine_host.py) in a process of its
own, so the step loop shares no GIL with gRPC. Under tensor parallel it is rank 0 and starts
the worker ranks itself.

It reads its ServerConfig and the model's text (tokenizer, EOS ids) from stdin, then
commands until stdin ends (the front stopped or
died: it exits at once, and its TP workers read end of file in turn) or its parent changes;
everything it has to say goes back on the pipe F.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading

from warmgate.server.control.engine_host import EngineHost, ReplyChannel, exit_now
from warmgate.server.cpu_threads import apply_cpu_threads
from warmgate.server.distributed.channel import receive
from warmgate.server.tp_worker import exit_with_parent

logger = logging.getLogger(__name__)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m warmgate.server.engine_main")
    parser.add_argument("--reply-fd", type=int, required=True,
                        help="the pipe everything the engine says goes to the front on")
    args = parser.parse_args(argv)
    # Ctrl-C reaches the whole process group; the front decides when the engine stops.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    exit_with_parent()
    stdin = sys.stdin.buffer
    config = receive(stdin)
    # The model's tokenizer and EOS ids as the front loaded them at start-up: the engine
    # never reads the model directory's text files again.
    text = receive(stdin) if config is not None else None
    if config is None or text is None:
        return 0  # the front went away before it sent everything
    logging.basicConfig(level=getattr(logging, config.log_level),
                        format="%(asctime)s %(levelname)s [engine] %(name)s: %(message)s")
    apply_cpu_threads(config.cpu_threads, config.runner.device.device)
    host = EngineHost(config, ReplyChannel(os.fdopen(args.reply_fd, "wb")), text)

    def front_gone() -> None:
        # Debug: the front logs the stop (its own last line may be a start-up error).
        logger.debug("engine: the front closed the command channel; exiting")
        exit_now(0)

    threading.Thread(target=host.read_commands, args=(stdin, front_gone),
                     name="engine-commands", daemon=True).start()
    logger.info("engine process %d ready for commands", os.getpid())
    host.run_jobs()
    return 0


if __name__ == "__main__":
    sys.exit(main())
