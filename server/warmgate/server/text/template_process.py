"""The chat template, compiled and rendered in worker processes (text.template_worker) with
bounds on time, memory and output; a render past a bound fails its request (PromptError
naming the template and the bound), never the server.

Up to `workers` processes render at once; a request waits for a free one, and at most
`queue` wait: `submit` refuses one more at once (RenderBusy), before it takes a thread. A
worker past its deadline is killed (it may be inside one C call that nothing else
interrupts) and replaced at the next render; one that ran out of memory is replaced too.

A request cancelled (its client gone, its deadline passed) is not rendered: one waiting for
a worker leaves the queue, and one being rendered has its worker killed, which frees the
slot at once (RenderCancelled). Renders of 20 slow requests their clients had given up on
held the next chat request for 11 s.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from warmgate.server.config.serving_config import CHAT_TEMPLATE_QUEUE
from warmgate.server.text.errors import PromptError, RenderBusy, RenderCancelled, TextLoadError
from warmgate.server.text.template_pipe import (
    CANCEL_POLL_S,
    TemplateWorker,
    WorkerCancelled,
    WorkerDied,
    WorkerTimeout,
    close_all,
)

logger = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True)
class TemplateLimits:
    # A compile or a render past this is ended (the worker killed).
    timeout_s: float = 1.0
    # The worker's address space (RLIMIT_AS); an interpreter with jinja2 takes about 25 MiB.
    memory_mib: int = 256
    # Renders running at once.
    workers: int = 2
    # Renders waiting for a worker, at most; more are refused (RenderBusy).
    queue: int = CHAT_TEMPLATE_QUEUE


class _Failure(Exception):
    """A compile or render that failed: its template's error, or the bound it passed."""


class BoundedChatTemplate:
    """The model's chat template, compiled (at construction, bounded like a render: a
    constant jinja folds cannot build a huge string here) and rendered in worker processes.
    TextLoadError naming `origin` when it does not compile within its bounds."""

    def __init__(self, source: str, origin: str, special_tokens: Mapping[str, str],
                 max_chars: int, limits: TemplateLimits) -> None:
        self.origin = origin
        self.max_chars = max_chars
        self.limits = limits
        self._compile_request = {"op": "compile", "source": source, "origin": origin,
                                 "special_tokens": dict(special_tokens),
                                 "max_chars": max_chars}
        self._lock = threading.Lock()
        self._idle: list[TemplateWorker] = []
        self._all: list[TemplateWorker] = []
        self._slots = threading.BoundedSemaphore(limits.workers)
        # Renders admitted by `submit`, running or waiting for a worker (under _lock), and
        # a thread for each: one admitted never waits for a thread.
        self._admitted = 0
        # Workers killed (past a bound, or rendering for a request since cancelled).
        self.workers_killed = 0
        self._refusing = False  # logged once per stretch at the bound, not once per refusal
        self._threads = ThreadPoolExecutor(max_workers=limits.workers + limits.queue,
                                           thread_name_prefix="chat-template")
        # Workers die with this object (and each exits at its stdin's end when we do).
        self._finalizer = weakref.finalize(self, close_all, self._all)
        try:
            self._idle.append(self._start_worker(at_load=True))
        except _Failure as exc:
            raise TextLoadError(origin, str(exc)) from None

    @property
    def idle_workers(self) -> int:
        """Workers started, with the template compiled, waiting for a render."""
        with self._lock:
            return len(self._idle)

    @property
    def in_flight(self) -> int:
        """Renders `submit` admitted that have not ended: running or waiting for a worker."""
        with self._lock:
            return self._admitted

    def close(self) -> None:
        self._finalizer()
        self._threads.shutdown(wait=False, cancel_futures=True)

    def submit(self, job: Callable[[threading.Event], T]) -> tuple[Future[T], threading.Event]:
        """Run job(cancelled) on a thread of its own, for a render (`render(messages,
        cancelled)` inside it): the future, and the event that cancels it (set it when the
        request is cancelled). RenderBusy, at once, when `workers` renders run and `queue`
        wait already."""
        limit = self.limits.workers + self.limits.queue
        with self._lock:
            if self._admitted >= limit:
                if not self._refusing:
                    self._refusing = True
                    logger.warning("chat template: %d renders running or waiting (%d workers "
                                   "+ a queue of %d); refusing more until one ends",
                                   self._admitted, self.limits.workers, self.limits.queue)
                raise RenderBusy(f"{self._admitted} chat template renders are running or "
                                 f"waiting, the most this server allows (--chat-template-"
                                 f"workers {self.limits.workers} + --chat-template-queue "
                                 f"{self.limits.queue}); retry later")
            self._admitted += 1
        cancelled = threading.Event()
        try:
            future = self._threads.submit(job, cancelled)
        except BaseException:
            self._release()
            raise
        # Done when the job returned or raised, or was cancelled before it started.
        future.add_done_callback(lambda _: self._release())
        return future, cancelled

    def _release(self) -> None:
        with self._lock:
            self._admitted -= 1
            if self._refusing and self._admitted < self.limits.workers + self.limits.queue:
                self._refusing = False
                logger.info("chat template: renders below their bound again (%d running or "
                            "waiting)", self._admitted)

    def render(self, messages: Sequence[Mapping[str, str]],
               cancelled: threading.Event | None = None) -> str:
        """The prompt text for `messages`; PromptError("messages", ...) naming the template
        and the bound it passed, or the template's own error; RenderCancelled once
        `cancelled` is set (waiting for a worker, or rendering: that worker is killed)."""
        request = {"op": "render", "messages": [dict(m) for m in messages]}
        try:
            self._take_slot(cancelled)
            try:
                with self._lock:
                    worker = self._idle.pop() if self._idle else None
                if worker is None:
                    worker = self._start_worker(at_load=False)
                # Cancelled while it waited for the slot, or for its worker to start: the
                # template never sees its messages.
                if cancelled is not None and cancelled.is_set():
                    self._park(worker)
                    raise RenderCancelled()
                try:
                    reply = self._call(worker, request, "rendering them", cancelled)
                finally:
                    self._park(worker)
                return str(reply["text"])
            finally:
                self._slots.release()
        except _Failure as exc:
            raise PromptError("messages", f"the model's chat template ({self.origin}) "
                                          f"{exc}") from None

    def _take_slot(self, cancelled: threading.Event | None) -> None:
        """Wait for one of the `workers` slots; RenderCancelled if the request is cancelled
        meanwhile: it leaves the queue at once, its place free for another request while
        the workers are still busy."""
        if cancelled is None:
            self._slots.acquire()
            return
        while not self._slots.acquire(timeout=CANCEL_POLL_S):
            if cancelled.is_set():
                raise RenderCancelled()

    def _park(self, worker: TemplateWorker) -> None:
        """A worker back among the idle ones, if it is still of use."""
        if worker.alive:
            with self._lock:
                self._idle.append(worker)

    def _start_worker(self, *, at_load: bool) -> TemplateWorker:
        try:
            worker = TemplateWorker(self.limits.memory_mib, self.limits.timeout_s)
        except (WorkerTimeout, WorkerDied, OSError) as exc:
            what = "did not start" if isinstance(exc, WorkerTimeout) else f"failed to start: {exc}"
            raise _Failure(f"its worker process {what}") from None
        with self._lock:
            self._all.append(worker)
        try:
            self._call(worker, self._compile_request, "compiling it")
        except _Failure:
            self._drop(worker)  # a worker without a template is of no use
            raise
        logger.log(logging.INFO if at_load else logging.DEBUG,
                   "chat template: worker %d compiled %s (bounds: %.1f s, %d MiB, %d "
                   "characters of output)", worker.pid, self.origin, self.limits.timeout_s,
                   self.limits.memory_mib, self.max_chars)
        return worker

    def _drop(self, worker: TemplateWorker) -> None:
        worker.kill()
        with self._lock:
            self.workers_killed += 1
            if worker in self._all:
                self._all.remove(worker)

    def _call(self, worker: TemplateWorker, request: dict[str, Any], doing: str,
              cancelled: threading.Event | None = None) -> dict[str, Any]:
        """The worker's reply to `request`, or _Failure; a worker past the time or memory
        bound is killed, and so is one whose request was cancelled (RenderCancelled)."""
        start = time.monotonic()
        try:
            reply = worker.call(request, self.limits.timeout_s, cancelled)
        except WorkerCancelled:
            self._drop(worker)  # its answer would come to the next request
            logger.debug("chat template: a render of a cancelled request stopped after "
                         "%.2f s (worker %d killed)", time.monotonic() - start, worker.pid)
            raise RenderCancelled() from None
        except WorkerTimeout:
            self._drop(worker)
            raise self._bound(doing, f"did not finish within {self.limits.timeout_s} s (the "
                              "time bound, --chat-template-timeout)") from None
        except WorkerDied as exc:
            self._drop(worker)
            # Past RLIMIT_CPU, or killed: the time bound, or a crash of the interpreter.
            raise self._bound(doing, f"ended its worker process ({exc}) after "
                              f"{time.monotonic() - start:.1f} s") from None
        error = reply.get("error")
        if error is None:
            return reply
        if error == "memory":
            self._drop(worker)  # a MemoryError can leave an interpreter half-broken
            raise self._bound(doing, f"needed more than {self.limits.memory_mib} MiB (the "
                              "memory bound, --chat-template-memory)")
        if error == "output":
            raise self._bound(doing, f"stopped: {reply['message']} (the output bound: a "
                              "prompt that long cannot fit max_model_len)")
        if error == "compile":  # already names the template
            raise _Failure(str(reply["message"]).removeprefix(f"{self.origin}: "))
        refused = "refused them" if request["op"] == "render" else "failed to compile"
        raise _Failure(f"{refused}: {reply['message']}")

    def _bound(self, doing: str, what: str) -> _Failure:
        logger.info("chat template %s: %s, %s", self.origin, doing, what)
        return _Failure(f"{doing}, {what}")
