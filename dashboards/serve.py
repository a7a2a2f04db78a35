"""One small HTTP server for a long-running process: ``/metrics`` and ``/healthz``.

``GET /metrics`` is the Prometheus exposition of ``registry``. ``GET /healthz``
answers 200 while ``health()`` says the process can do its work and 503 while it
cannot, with a JSON body naming why, so a supervisor (Kubernetes readiness,
systemd, a load balancer) can act on it. Served from a daemon thread.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

Health = Callable[[], tuple[bool, Mapping[str, Any]]]


def serve_metrics(
    registry: CollectorRegistry, host: str, port: int, health: Health | None = None
) -> ThreadingHTTPServer:
    """Start serving; raises ``OSError`` if the address is taken. ``server.shutdown()``
    stops it."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                self._send(200, generate_latest(registry), CONTENT_TYPE_LATEST)
            elif path == "/healthz":
                ok, detail = health() if health is not None else (True, {})
                body = json.dumps({"status": "ok" if ok else "unavailable", **detail})
                self._send(200 if ok else 503, body.encode(), "application/json")
            else:
                self._send(404, b'{"detail": "not found: try /metrics or /healthz"}',
                           "application/json")

        def _send(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet
            return None

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="vigil-metrics", daemon=True).start()
    return server
