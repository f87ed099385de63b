"""/metrics over HTTP: the server's Metrics registry on --metrics-port, a thread per
connection, with the connections capped and timed out."""

from __future__ import annotations

import logging
import socket
import sys
import threading
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler

from prometheus_client import make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

from warmgate.server.config.listen_address import address_family, bare_host, is_ipv6
from warmgate.server.config.server_config import (
    METRICS_IDLE_TIMEOUT_S,
    METRICS_MAX_CONNECTIONS,
)
from warmgate.server.core.stream_cap import StreamCap
from warmgate.server.telemetry.metrics import Metrics

logger = logging.getLogger(__name__)


class HostWSGIServer(ThreadingWSGIServer):
    """The metrics HTTP server on the address family of --host; on `::` IPv4 too (dual stack,
    as gRPC binds `[::]`).

    A thread per connection, at most `max_connections` at once, each closed after
    `idle_timeout_s` without a byte either way: the server runs in the gRPC front process,
    where 3,000 idle connections were 3,026 threads, and their GIL turns alone pushed a
    health Check past its deadline. A connection past the cap is answered 503 and closed at
    once, on the accepting thread.
    """

    # Connection threads are daemons; closing the server does not wait for a slow scrape.
    block_on_close = False
    # socketserver's default backlog of 5 stalls a burst of connects for seconds of SYN
    # retries before the accepting thread even sees them to refuse them.
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], handler: Any, *,
                 max_connections: int = METRICS_MAX_CONNECTIONS,
                 idle_timeout_s: float = METRICS_IDLE_TIMEOUT_S) -> None:
        self.address_family = address_family(address[0])
        self.idle_timeout_s = idle_timeout_s
        self._cap = StreamCap("metrics", "--metrics-max-connections", max_connections,
                              "scrape again once one has ended", unit="connections")
        self._cap_lock = threading.Lock()  # taken on the accepting thread, freed on others
        super().__init__(address, handler)

    def server_bind(self) -> None:
        if self.address_family == socket.AF_INET6:
            self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        super().server_bind()

    @property
    def open_connections(self) -> int:
        return self._cap.open

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._cap_lock:
            refusal = self._cap.take()
        if refusal is not None:
            _refuse(request, refusal)
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:  # no thread started: nothing else frees the slot
            self._release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._release()

    def _release(self) -> None:
        with self._cap_lock:
            self._cap.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """One line, never socketserver's traceback on stderr: a connection that went idle
        past the timeout, or that its client reset, is the client's doing."""
        exc = sys.exc_info()[1]
        if isinstance(exc, OSError):  # TimeoutError included
            logger.debug("metrics: connection from %s ended: %s", client_address, exc)
        else:
            logger.warning("metrics: a request from %s failed: %s: %s", client_address,
                           type(exc).__name__, exc)


def _refuse(request: socket.socket, refusal: str) -> None:
    """A 503 saying why, if the fresh socket's buffer takes it at once; the caller closes."""
    body = (refusal + "\n").encode()
    head = (f"HTTP/1.0 503 Service Unavailable\r\nContent-Type: text/plain\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
    try:
        request.setblocking(False)
        request.send(head + body)
    except OSError:  # the client is gone, or its window is full: the close says enough
        pass


class _QuietHandler(WSGIRequestHandler):
    def setup(self) -> None:
        super().setup()
        # Each read and write of the connection then fails past it, and its thread ends.
        self.connection.settimeout(getattr(self.server, "idle_timeout_s", None))

    def log_message(self, format: str, *args: object) -> None:
        """Scrapes every few seconds would flood the log; stay silent."""


class MetricsEndpoint:
    """/metrics over HTTP on a daemon thread; port 0 binds a free port (see `port`).

    prometheus_client's start_http_server would do, except that its serve_forever polls
    for shutdown every 0.5 s, which every server stop (and every test) would wait out, and
    that its connections are neither capped nor timed out (HostWSGIServer).
    """

    POLL_S = 0.05

    def __init__(self, metrics: Metrics, host: str, port: int, *,
                 max_connections: int = METRICS_MAX_CONNECTIONS,
                 idle_timeout_s: float = METRICS_IDLE_TIMEOUT_S) -> None:
        host = bare_host(host)  # the same --host the gRPC server binds
        self._httpd = HostWSGIServer((host, port), _QuietHandler,
                                     max_connections=max_connections,
                                     idle_timeout_s=idle_timeout_s)
        self._httpd.set_app(make_wsgi_app(metrics.registry))
        self.port: int = self._httpd.server_port
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(self.POLL_S,),
                                        name="warmgate-metrics", daemon=True)
        self._thread.start()
        logger.info("metrics on http://%s:%d/metrics (at most %d connections, each closed "
                    "after %.1f s idle)", f"[{host}]" if is_ipv6(host) else host, self.port,
                    max_connections, idle_timeout_s)

    @property
    def open_connections(self) -> int:
        return self._httpd.open_connections

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
