"""A local Prometheus server (Debian's ``prometheus``) and a small query client.

``LocalPrometheus`` starts the real server on a free loopback port with a
temporary TSDB, scraping the given targets every ``scrape_interval_s``; tests,
benches and ``monitor report`` use it. ``PrometheusClient`` runs instant and
range queries over the HTTP API and raises one clear error for a failed query.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from streams.broker import free_port


class PrometheusError(RuntimeError):
    """A query Prometheus refused or could not answer (the message says which and why)."""


@dataclass(frozen=True)
class PrometheusClient:
    """Queries a Prometheus server's HTTP API (``/api/v1/query``, ``/api/v1/query_range``)."""

    url: str
    timeout_s: float = 30.0

    def _get(self, path: str, params: dict[str, str]) -> Any:
        q = urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(f"{self.url.rstrip('/')}{path}?{q}",
                                        timeout=self.timeout_s) as r:
                body = json.loads(r.read())
        except urllib.error.HTTPError as e:
            try:
                body = json.loads(e.read())
            except ValueError:
                raise PrometheusError(f"Prometheus at {self.url} answered HTTP {e.code}") from None
        except (urllib.error.URLError, OSError) as e:
            raise PrometheusError(f"cannot reach Prometheus at {self.url}: {e}") from None
        if body.get("status") != "success":
            raise PrometheusError(
                f"query {params.get('query', '')[:200]!r} failed: "
                f"{body.get('errorType', '?')}: {body.get('error', '?')}")
        return body["data"]

    def query(self, promql: str, at: float | None = None) -> list[dict[str, Any]]:
        """Instant query: ``[{"metric": {...}, "value": [t, "v"]}, ...]``."""
        params = {"query": promql}
        if at is not None:
            params["time"] = f"{at:.3f}"
        data = self._get("/api/v1/query", params)
        result = data["result"]
        return result if isinstance(result, list) else [{"metric": {}, "value": result}]

    def query_range(self, promql: str, start: float, end: float,
                    step_s: float) -> list[dict[str, Any]]:
        """Range query: ``[{"metric": {...}, "values": [[t, "v"], ...]}, ...]``."""
        data = self._get("/api/v1/query_range", {
            "query": promql, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step_s:g}"})
        return list(data["result"])

    def value(self, promql: str) -> float | None:
        """The single value of an instant query (None when it returns no series)."""
        got = self.query(promql)
        if not got:
            return None
        if len(got) > 1:
            raise PrometheusError(f"query {promql[:200]!r} returned {len(got)} series, not one")
        return float(got[0]["value"][1])

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url.rstrip('/')}/-/ready", timeout=2) as r:
                return bool(r.status == 200)
        except (urllib.error.URLError, OSError):
            return False


class LocalPrometheus:
    """Debian's Prometheus on ``127.0.0.1:PORT`` scraping ``targets`` (``host:port``), and
    ``bearer_targets`` (``{host:port: token}``) with ``Authorization: Bearer <token>`` (the
    paging service's ``/metrics`` needs one)."""

    def __init__(self, targets: Sequence[str], *, scrape_interval_s: float = 1.0,
                 binary: str = "prometheus", port: int | None = None,
                 bearer_targets: Mapping[str, str] | None = None) -> None:
        self.targets = list(targets)
        self.bearer_targets = dict(bearer_targets or {})
        self.scrape_interval_s = scrape_interval_s
        self.binary = binary
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.client = PrometheusClient(self.url)
        self._dir: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 30.0) -> LocalPrometheus:
        exe = shutil.which(self.binary)
        if exe is None:
            raise FileNotFoundError(
                f"no {self.binary!r} on PATH: install Debian's Prometheus "
                "(apt-get install prometheus; `make test` does)")
        self._dir = Path(tempfile.mkdtemp(prefix="vigil-prometheus-"))
        interval = f"{max(1, round(self.scrape_interval_s * 1000))}ms"
        jobs: list[dict[str, Any]] = [
            {"job_name": "vigil", "static_configs": [{"targets": self.targets}]}]
        jobs += [{"job_name": f"vigil-{i}", "static_configs": [{"targets": [target]}],
                  "authorization": {"type": "Bearer", "credentials": token}}
                 for i, (target, token) in enumerate(sorted(self.bearer_targets.items()))]
        config = {
            "global": {"scrape_interval": interval, "evaluation_interval": interval},
            "scrape_configs": jobs,
        }
        (self._dir / "prometheus.yml").write_text(json.dumps(config))  # JSON is YAML
        log = (self._dir / "prometheus.log").open("wb")
        self._proc = subprocess.Popen(
            [exe, f"--config.file={self._dir / 'prometheus.yml'}",
             f"--storage.tsdb.path={self._dir / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}",
             "--web.enable-lifecycle", "--log.level=warn"],
            stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout_s
        while not self.client.ready():
            if self._proc.poll() is not None:
                raise PrometheusError(f"prometheus exited {self._proc.returncode}: {self.log()}")
            if time.monotonic() > deadline:
                self.stop()
                raise PrometheusError(f"prometheus not ready within {timeout_s:.0f} s")
            time.sleep(0.1)
        return self

    def log(self) -> str:
        return (self._dir / "prometheus.log").read_text(errors="replace")[-3000:] if self._dir \
            else ""

    def wait_for(self, promql: str, timeout_s: float = 60.0) -> list[dict[str, Any]]:
        """Poll ``promql`` until it returns a series; raise with the server's log if not."""
        deadline = time.monotonic() + timeout_s
        while True:
            got = self.client.query(promql)
            if got:
                return got
            if time.monotonic() > deadline:
                raise PrometheusError(f"no data for {promql[:200]!r} within {timeout_s:.0f} s")
            time.sleep(0.5)

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(5)
        self._proc = None
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def __enter__(self) -> LocalPrometheus:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
