"""The health endpoint: ``/healthz`` (the process answers), ``/readyz`` (replication is healthy)
and ``/metrics`` (the process's metrics, :mod:`core.metrics`, in Prometheus's text format).

Readiness is about replication, not the process: the slot's reader is connected, its
heartbeats come back through the slot, and nothing fatal happened. A process of a cluster
that does not read the slot is ready when it is up. Loopback by default; a port that is
taken is logged and skipped (several pipelines on one host, or the processes of a cluster
started on one host with one config): health is an aid, never a reason to stop
replicating. Each process serves its own figures only: nothing is gathered across a
cluster.
"""

from __future__ import annotations

import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST

from core.runtime import Runtime

log = logging.getLogger("walflow.health")


class _Handler(BaseHTTPRequestHandler):
    runtime: Runtime  # set on the subclass that serve() makes

    def do_GET(self) -> None:
        if self.path == "/healthz":
            self._reply(200, {"status": "up"})
        elif self.path == "/readyz":
            readers = self.runtime.health()
            ready = all(r["ready"] for r in readers)
            self._reply(200 if ready else 503, {"status": "ready" if ready else "not ready", "slots": readers})
        elif self.path == "/metrics":
            self._send(200, self.runtime.metrics.exposition(), CONTENT_TYPE_LATEST)
        else:
            self._reply(404, {"error": "try /healthz, /readyz or /metrics"})

    def _reply(self, code: int, body: dict[str, object]) -> None:
        self._send(code, json.dumps(body).encode(), "application/json")

    def _send(self, code: int, data: bytes, content_type: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        return


def serve(runtime: Runtime, host: str, port: int) -> ThreadingHTTPServer | None:
    """Serve ``runtime``'s health on ``host:port`` from a daemon thread; None if the port is taken."""
    handler = type("Handler", (_Handler,), {"runtime": runtime})
    try:
        server = ThreadingHTTPServer((host, port), handler)
    except OSError as exc:
        log.warning("health endpoint not started on %s:%d: %s", host, port, exc)
        return None
    threading.Thread(target=server.serve_forever, name="walflow-health", daemon=True).start()
    log.info("health endpoint on http://%s:%d/readyz", host, server.server_address[1])
    return server
