"""Start-up work that depends on nothing but the configuration, begun before the server binds.

Two things need only the configuration, and each costs seconds that the rest of the
start-up (the server's imports, configuration checks, tokenizer, gRPC servers, compile-cache
entry) does not need to wait for:

- the CUDA context: created on a background thread, so the model load on the runner's worker
  thread finds it ready (torch's lazy init is locked: a load that gets there first waits for
  it rather than creating a second one). It needs only --device, so main starts it first of
  all (`begin_cuda_context`): right after `import torch`, before the rest of the server is
  imported and the configuration checked, which then overlap the context's creation;
- the weight files' pages: `posix_fadvise(WILLNEED)` asks the kernel to read them into the
  page cache now, so a cold disk is being read while CUDA starts and the servers bind.

Neither changes what the load does: a failure here is logged as such and the load, which does
the same work again, reports it the usual way (health FAILED with the reason).
FlashInfer is not imported at this point: it reads its workspace directory from the
environment at import, which the compile-cache entry sets later, on the worker thread; the
engine then starts its import on a thread of its own (`import_in_background`), beside the
weights' load.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from warmgate.server.config.runner_config import RunnerConfig
from warmgate.server.config.server_config import build_parser
from warmgate.server.config.weight_index import weight_files

logger = logging.getLogger(__name__)


class BackgroundStartup:
    """Threads doing the start-up's independent work. A line that is ready before logging is
    configured waits for `logging_ready`, so none is lost to the unconfigured root logger.

    The threads are not daemons: a start-up that exits early (exit 2 on a busy port) waits
    for them, rather than tearing the interpreter down under a thread inside a CUDA call.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._logging = False
        self._held: list[str] = []
        self._threads: list[threading.Thread] = []
        # What was started, for the one line that says so.
        self.started: list[str] = []
        # The names of the threads started ("cuda", "readahead").
        self.names: list[str] = []

    def start(self, name: str, what: str, work: Callable[[], str]) -> None:
        self.started.append(what)
        self.names.append(name)

        def run() -> None:
            line = work()
            with self._lock:
                if not self._logging:
                    self._held.append(line)
                    return
            logger.info("%s", line)

        thread = threading.Thread(target=run, name=f"warmgate-startup-{name}")
        thread.start()
        self._threads.append(thread)

    def logging_ready(self) -> None:
        """Logging is configured: say what runs, then what already finished."""
        with self._lock:
            self._logging = True
            held, self._held = self._held, []
        logger.info("start-up: in the background: %s",
                    ", ".join(self.started) or "nothing (no CUDA device, no weight files)")
        for line in held:
            logger.info("%s", line)

    def join(self, timeout: float | None = None) -> None:
        """Wait for every thread (for tests)."""
        for thread in self._threads:
            thread.join(timeout)


def wants_cuda(device: str) -> bool:
    """A device the load will put on CUDA (or may: "auto" picks CUDA when there is one)."""
    return device == "auto" or device.startswith("cuda")


def create_cuda_context(device: str) -> str:
    """Import torch and create the CUDA context on `device`; the log line to write."""
    start = time.perf_counter()
    try:
        import torch

        if not torch.cuda.is_available():
            return (f"start-up: no CUDA device for --device {device}; no context created in "
                    "the background")
        target = torch.device("cuda" if device == "auto" else device)
        torch.zeros(1, device=target)
        torch.cuda.synchronize(target)
    except Exception as exc:  # the load does the same and reports it; this only timed it
        return (f"start-up: CUDA context on {device} failed in the background after "
                f"{time.perf_counter() - start:.3f} s ({type(exc).__name__}: {exc}); the "
                "model load will report it")
    return (f"start-up: CUDA context on {target} in {time.perf_counter() - start:.3f} s "
            "(in the background, beside the server's imports, configuration and start)")


def read_ahead(files: list[Path]) -> str:
    """Ask the kernel to read the files into the page cache; the log line to write."""
    start = time.perf_counter()
    size = 0
    try:
        for path in files:
            fd = os.open(path, os.O_RDONLY)
            try:
                size += os.fstat(fd).st_size
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
            finally:
                os.close(fd)
    except OSError as exc:  # only a hint to the kernel: the load reads and reports the file
        return (f"start-up: read-ahead stopped after {time.perf_counter() - start:.3f} s "
                f"({type(exc).__name__}: {exc}); the model load will report it")
    return (f"start-up: read-ahead of {len(files)} weight files ({size / 1e9:.2f} GB) "
            f"requested in {time.perf_counter() - start:.3f} s")


def requested_device(argv: Sequence[str], environ: Mapping[str, str]) -> str:
    """The --device the flags (or WARMGATE_DEVICE) ask for, "auto" unresolved, read with the
    server's own parser: a bad flag or --help exits here just as the full parse would."""
    return str(build_parser(environ).parse_args(argv).device)


def context_device(argv: Sequence[str], environ: Mapping[str, str]) -> str:
    """The device whose context main starts early: the requested one, or "cpu" (none) with
    --engine-process, whose engine owns the device (a CUDA context here would only hold
    device memory the engine's KV cache could use)."""
    args = build_parser(environ).parse_args(argv)
    return "cpu" if args.engine_process and not args.warmup_only else str(args.device)


def begin_cuda_context(device: str) -> BackgroundStartup:
    """Main's first step: import torch and start creating the CUDA context (a device that
    wants CUDA), before anything else of the server is imported. What follows, the rest of
    the imports and the configuration checks, runs beside the context's creation (torch
    releases the GIL in its device calls). `begin_background_startup` adds the rest."""
    startup = BackgroundStartup()
    if wants_cuda(device):
        import torch  # noqa: F401  # here, on this thread: the context's thread starts after it

        startup.start("cuda", f"CUDA context ({device})", lambda: create_cuda_context(device))
    return startup


def _weight_files(directory: str | None) -> list[Path]:
    """The files the load will read; none when the index is broken (the load says so)."""
    if not directory:
        return []
    try:
        return list(weight_files(directory).files)
    except (ValueError, OSError):  # ModelLoadError is a ValueError
        return []


def begin_background_startup(config: RunnerConfig,
                             startup: BackgroundStartup | None = None, *,
                             cuda: bool = True) -> BackgroundStartup:
    """Start the CUDA context (unless `startup`, from begin_cuda_context, already has, or
    not `cuda`: an engine process owns the device) and the weights' read-ahead (the page
    cache it fills serves the engine process too), whichever apply (logged by
    logging_ready)."""
    startup = startup if startup is not None else BackgroundStartup()
    device = config.device.device
    directory = config.model.weights_path
    files = _weight_files(directory)
    if cuda and wants_cuda(device) and "cuda" not in startup.names:
        startup.start("cuda", f"CUDA context ({device})", lambda: create_cuda_context(device))
    if files:
        startup.start("readahead", f"read-ahead of {len(files)} weight files",
                      lambda: read_ahead(files))
    return startup


def import_in_background(module: str) -> threading.Thread | None:
    """Start importing `module` (the attention backend's library) on a thread of its own, so
    the import runs beside the weights' load (file reads and host-to-device copies, which
    release the GIL); the backend's own `import` then waits for it on the import lock. None
    when the module is already imported or not installed (the backend reports that itself).
    Called once the compile-cache entry has set the environment the library reads at import.
    """
    if module in sys.modules or importlib.util.find_spec(module) is None:
        return None

    def run() -> None:
        start = time.perf_counter()
        try:
            importlib.import_module(module)
        except Exception as exc:  # the backend imports it again and reports the failure
            logger.info("start-up: importing %s in the background failed (%s: %s); the "
                        "attention backend will report it", module, type(exc).__name__, exc)
            return
        logger.info("start-up: %s imported in the background in %.3f s (beside the weights' "
                    "load)", module, time.perf_counter() - start)

    thread = threading.Thread(target=run, name=f"warmgate-import-{module}")
    thread.start()
    return thread
