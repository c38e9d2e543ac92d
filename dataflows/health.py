"""The health endpoint: ``/healthz`` (the process answers), ``/readyz`` (replication is healthy)
and ``/metrics`` (the process's metrics, :mod:`core.metrics`, in Prometheus's text format).

Readiness is about replication, not the process: the slot's reader is connected, its
heartbeats come back through the slot, and nothing fatal happened. A process of a cluster
that does not read the slot is ready when it is up. Loopback by default; a port that is
taken is logged and skipped (several pipelines on one host, or the processes of a cluster
started on one host with one config): health is an aid, never a reason to stop
replicating. Each process serves its own figures only: nothing is gathered across a
cluster.

With credentials in ``walflow.health`` (basic or bearer), ``/readyz`` and ``/metrics``
answer 401 to a request without them; ``/healthz`` stays open (it tells nothing but that
the process answers, and liveness probes carry no credentials). Listening beyond loopback
without credentials is warned about once, at start. A request must arrive whole, at most
:data:`MAX_REQUEST` bytes, within :data:`REQUEST_TIMEOUT` seconds of the connection: a
client that connects and sends nothing, or trickles, does not hold a handler thread.
"""

from __future__ import annotations

import hmac
import io
import ipaddress
import json
import logging
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Final

from prometheus_client import CONTENT_TYPE_LATEST

from config.schema import HealthSettings
from core.runtime import Runtime

log = logging.getLogger("walflow.health")

#: Seconds a client has, from connecting, to send its whole request.
REQUEST_TIMEOUT: Final = 5.0
#: The largest request line and headers together (a probe's or Prometheus's take a few hundred bytes).
MAX_REQUEST: Final = 16 * 1024


class _Bounded(io.BufferedIOBase):
    """A connection's input as the request parser reads it: lines only, at most ``size``
    bytes in all, each read given only what is left of the request's deadline."""

    def __init__(self, raw: io.BufferedIOBase, connection: socket.socket, size: int, seconds: float) -> None:
        super().__init__()
        self._raw, self._connection = raw, connection
        self._left, self._deadline = size, time.monotonic() + seconds

    @property
    def exceeded(self) -> bool:
        """Whether the request was longer than allowed (what was read of it is cut short)."""
        return self._left < 0

    def readline(self, size: int | None = -1, /) -> bytes:
        remaining = self._deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"no whole request within {REQUEST_TIMEOUT:g} s")
        self._connection.settimeout(remaining)
        cap = max(0, self._left + 1) if size is None or size < 0 else min(size, max(0, self._left + 1))
        line = self._raw.readline(cap)
        self._left -= len(line)
        return line

    def close(self) -> None:
        self._raw.close()
        super().close()


class _Handler(BaseHTTPRequestHandler):
    runtime: Runtime  # set on the subclass that serve() makes
    #: The ``Authorization`` header /readyz and /metrics need (set on that subclass too); None: open.
    authorization: str | None = None
    #: Each read and write on the connection (the request's own deadline is shorter still).
    timeout = REQUEST_TIMEOUT

    def setup(self) -> None:
        super().setup()
        self.rfile = self._bounded = _Bounded(self.rfile, self.connection, MAX_REQUEST, REQUEST_TIMEOUT)

    def parse_request(self) -> bool:
        if not super().parse_request():
            return False
        if self._bounded.exceeded:
            self.send_error(431, f"request line and headers over {MAX_REQUEST} bytes")
            return False
        return True

    def do_GET(self) -> None:
        if self.path == "/healthz":
            self._reply(200, {"status": "up"})
        elif (challenge := self._challenge()) is not None:
            self._reply(401, {"error": "credentials needed (walflow.health)"}, {"WWW-Authenticate": challenge})
        elif self.path == "/readyz":
            readers = self.runtime.health()
            ready = all(r["ready"] for r in readers)
            self._reply(200 if ready else 503, {"status": "ready" if ready else "not ready", "slots": readers})
        elif self.path == "/metrics":
            self._send(200, self.runtime.metrics.exposition(), CONTENT_TYPE_LATEST)
        else:
            self._reply(404, {"error": "try /healthz, /readyz or /metrics"})

    def _challenge(self) -> str | None:
        """None when the request may have what it asks for, else the ``WWW-Authenticate`` to
        answer with. The scheme compares without case (RFC 9110), the credentials in constant time."""
        if self.authorization is None:
            return None
        scheme, _, credentials = (self.headers.get("Authorization") or "").strip().partition(" ")
        wanted_scheme, _, wanted = self.authorization.partition(" ")
        if hmac.compare_digest(credentials.strip().encode(), wanted.encode()) and scheme.lower() == wanted_scheme.lower():
            return None
        return f'{wanted_scheme} realm="walflow"'

    def _reply(self, code: int, body: dict[str, object], headers: dict[str, str] | None = None) -> None:
        self._send(code, json.dumps(body).encode(), "application/json", headers)

    def _send(self, code: int, data: bytes, content_type: str, headers: dict[str, str] | None = None) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        return


def loopback(host: str) -> bool:
    """Whether ``host`` is reachable from this machine only (127.0.0.0/8, ::1, localhost)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name (other than localhost), or "" (every address)
        return False


def serve(runtime: Runtime, settings: HealthSettings) -> ThreadingHTTPServer | None:
    """Serve ``runtime``'s health as ``settings`` say from a daemon thread; None if the port is taken."""
    handler = type("Handler", (_Handler,), {"runtime": runtime, "authorization": settings.authorization})
    host, port = settings.host, settings.port
    try:
        server = ThreadingHTTPServer((host, port), handler)
    except OSError as exc:
        log.warning("health endpoint not started on %s:%d: %s", host, port, exc)
        return None
    threading.Thread(target=server.serve_forever, name="walflow-health", daemon=True).start()
    log.info("health endpoint on http://%s:%d/readyz", host, server.server_address[1])
    if settings.authorization is None and not loopback(host):
        log.warning("the health endpoint listens beyond loopback without credentials: anyone who reaches "
                    "it reads /readyz and /metrics; set walflow.health.token (or username and password)",
                    extra={"host": host, "port": server.server_address[1]})
    return server
