"""The broker dies under the stream: `monitor broker` notices, or restarts it on the same
port; with file storage a restart loses no record and no committed offset.

Real Tansu processes, killed with SIGKILL as a crash or the OOM killer would.
"""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import NewTopic

from streams.broker import BrokerError, EmbeddedBroker, free_port
from streams.config import Topics

pytestmark = pytest.mark.broker

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_TOPICS = [str(field.default) for field in Topics.model_fields.values()]


class Launcher:
    """`monitor broker ...` in a subprocess, its output read line by line as it comes."""

    def __init__(self, *args: str) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("VIGIL_")}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "monitor.cli", "broker", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=ROOT,
            env=env,
        )
        self.lines: list[str] = []
        self._queue: queue.Queue[str] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._queue.put(line.rstrip("\n"))

    def wait_for(self, pattern: str, timeout_s: float = 15) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                line = self._queue.get(timeout=0.1)
            except queue.Empty:
                continue
            self.lines.append(line)
            if re.search(pattern, line):
                return line
        raise AssertionError(f"no line matching {pattern!r} in {timeout_s} s: {self.lines}")

    def output(self) -> str:
        """Everything it printed; call once it has exited."""
        self._reader.join(5)
        while not self._queue.empty():
            self.lines.append(self._queue.get())
        return "\n".join(self.lines)

    def tansu_pid(self) -> int:
        """The launcher's child: Tansu."""
        children = [
            int(stat.split()[0])
            for stat in _proc_stats()
            if int(stat.rsplit(")", 1)[1].split()[1]) == self.proc.pid
        ]
        assert len(children) == 1, children
        return children[0]

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(15)


def _proc_stats() -> Iterator[str]:
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                yield Path(f"/proc/{entry}/stat").read_text()
            except OSError:  # exited meanwhile
                continue


@pytest.fixture
def launch() -> Iterator[type[Launcher]]:
    started: list[Launcher] = []

    class Tracked(Launcher):
        def __init__(self, *args: str) -> None:
            super().__init__(*args)
            started.append(self)

    yield Tracked
    for launcher in started:
        if launcher.proc.poll() is None:
            launcher.proc.kill()
            launcher.proc.wait(10)


def _produce(bootstrap: str, topic: str, *values: bytes) -> None:
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
    try:
        for value in values:
            producer.send(topic, value, partition=0).get(10)
    finally:
        producer.close(timeout=5)


def _consume(
    bootstrap: str, topic: str, n: int, group: str | None = None, timeout_s: float = 10
) -> list[bytes]:
    """Read ``n`` records of partition 0: from the group's committed offset, or the start."""
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        session_timeout_ms=6000,
        heartbeat_interval_ms=2000,
    )
    tp = TopicPartition(topic, 0)
    consumer.assign([tp])
    got: list[bytes] = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(got) < n and time.monotonic() < deadline:
            for records in consumer.poll(200, max_records=n - len(got)).values():
                got += [r.value for r in records]
        if group is not None:
            consumer.commit()
    finally:
        consumer.close()
    return got


def _committed(bootstrap: str, topic: str, group: str) -> int | None:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    try:
        return consumer.committed(TopicPartition(topic, 0))
    finally:
        consumer.close()


def _topics(bootstrap: str) -> set[str]:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        return set(admin.list_topics())
    finally:
        admin.close()


def test_monitor_broker_exits_non_zero_naming_the_signal_when_tansu_is_killed(
    launch: type[Launcher],
) -> None:
    port = free_port()
    broker = launch("--port", str(port))
    broker.wait_for(f"broker ready on 127.0.0.1:{port}")
    os.kill(broker.tansu_pid(), signal.SIGKILL)
    assert broker.proc.wait(5) == 2
    message = broker.output().splitlines()[-1]
    assert message.startswith(
        f"monitor broker: the broker (Tansu) on 127.0.0.1:{port} was killed by signal 9 (SIGKILL)"
    )
    assert "its last log lines: tansu broker" in message  # the log tail, without colour codes
    assert "\x1b" not in message


def test_monitor_broker_restart_brings_tansu_back_on_the_same_port_with_the_topics(
    launch: type[Launcher],
) -> None:
    port = free_port()
    bootstrap = f"127.0.0.1:{port}"
    broker = launch("--port", str(port), "--restart")
    broker.wait_for(f"broker ready on {bootstrap}")
    first = broker.tansu_pid()
    for restart in (1, 2):  # twice: the second death is noticed as well as the first
        os.kill(broker.tansu_pid(), signal.SIGKILL)
        line = broker.wait_for("restarting it")
        assert f"on {bootstrap} was killed by signal 9 (SIGKILL)" in line
        assert f"(restart {restart})" in line
        broker.wait_for(f"the broker is back on {bootstrap}")
    assert broker.proc.poll() is None and broker.tansu_pid() != first
    assert set(DEFAULT_TOPICS) <= _topics(bootstrap)  # a memory broker's topics, created again
    _produce(bootstrap, DEFAULT_TOPICS[0], b"after the restart")
    assert _consume(bootstrap, DEFAULT_TOPICS[0], 1) == [b"after the restart"]
    assert broker.stop() == 0


def test_file_storage_keeps_records_and_committed_offsets_across_a_kill(tmp_path: Path) -> None:
    with EmbeddedBroker(storage=f"file://{tmp_path / 'store'}") as broker:
        bootstrap = broker.bootstrap_servers
        admin = KafkaAdminClient(bootstrap_servers=bootstrap)
        admin.create_topics([NewTopic("steps", 3, 1)])
        admin.close()
        _produce(bootstrap, "steps", *(f"step {i}".encode() for i in range(5)))
        assert _consume(bootstrap, "steps", 3, group="screen") == [b"step 0", b"step 1", b"step 2"]
        assert _committed(bootstrap, "steps", "screen") == 3

        broker.kill()
        assert broker.returncode == -signal.SIGKILL
        broker.restart()
        assert broker.bootstrap_servers == bootstrap and broker.running

        assert _committed(bootstrap, "steps", "screen") == 3
        assert _consume(bootstrap, "steps", 2, group="screen") == [b"step 3", b"step 4"]
        _produce(bootstrap, "steps", b"step 5")  # the log goes on where it stopped
        assert _consume(bootstrap, "steps", 6) == [f"step {i}".encode() for i in range(6)]
        assert _committed(bootstrap, "steps", "screen") == 5


def test_file_storage_outlives_the_launcher_itself(launch: type[Launcher], tmp_path: Path) -> None:
    storage = f"file://{tmp_path / 'store'}"
    port = free_port()
    bootstrap = f"127.0.0.1:{port}"
    broker = launch("--port", str(port), "--storage", storage, "--restart")
    assert f"(kept in {storage};" in broker.wait_for("broker ready")
    _produce(bootstrap, DEFAULT_TOPICS[0], b"kept")
    os.kill(broker.tansu_pid(), signal.SIGKILL)  # Tansu crashes: restarted, nothing lost
    broker.wait_for("the broker is back on")
    assert _consume(bootstrap, DEFAULT_TOPICS[0], 1, group="g") == [b"kept"]
    assert broker.stop() == 0

    again = launch("--port", str(port), "--storage", storage)  # the whole thing restarted
    again.wait_for("broker ready")
    _produce(bootstrap, DEFAULT_TOPICS[0], b"more")
    assert _consume(bootstrap, DEFAULT_TOPICS[0], 1, group="g") == [b"more"]
    assert _consume(bootstrap, DEFAULT_TOPICS[0], 2) == [b"kept", b"more"]
    assert again.stop() == 0


def test_restart_rebinds_the_same_port_at_once_with_clients_connected() -> None:
    with EmbeddedBroker() as broker:
        bootstrap = broker.bootstrap_servers
        producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
        producer.send("held", b"x").get(10)  # an open connection when the broker dies
        broker.kill()
        started = time.monotonic()
        broker.restart()
        assert time.monotonic() - started < 3 and broker.running
        producer.close(timeout=1)
        _produce(bootstrap, "held", b"y")
        assert _consume(bootstrap, "held", 1) == [b"y"]  # memory storage: only what came after


def test_a_port_held_by_another_process_is_refused_not_mistaken_for_the_broker() -> None:
    with EmbeddedBroker() as holder:
        squatter = EmbeddedBroker(port=holder.port, bind_timeout_s=0.5)
        with pytest.raises(BrokerError, match="the port is still in use after 0 s"):
            squatter.start()
        assert not squatter.running


def test_a_storage_engine_this_tansu_lacks_fails_with_one_sentence(
    launch: type[Launcher],
) -> None:
    broker = launch("--port", str(free_port()), "--storage", "postgres://postgres@127.0.0.1/x")
    assert broker.proc.wait(15) == 2
    message = broker.output().splitlines()[-1]
    assert message.startswith(
        "monitor broker: this Tansu build cannot use the storage 'postgres://postgres@127.0.0.1/x'"
    )
    assert "file:///DIR" in message and 'FeatureNotEnabled { feature: "postgres"' in message
