"""Fixtures of the worker tests: the real paging service under uvicorn (SQLite in a tmp
dir), ``monitor stream`` processes (topics of a test's own: ``tests/conftest.py``)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from monitor.demo import PagingServer, paging_server
from streams.broker import EmbeddedBroker
from streams.bus import Bus, Message
from streams.config import KafkaSettings, Topics
from streams.kafka import KafkaBus
from streams.processor import H_IDEMPOTENCY, publish_record
from streams.records import Trajectory, decode, step_events

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def paging(tmp_path: Path) -> Iterator[PagingServer]:
    folder = tmp_path / "paging"
    folder.mkdir()
    with paging_server(folder) as server:
        yield server


def topic_env(topics: Topics) -> dict[str, str]:
    return {f"VIGIL_TOPIC_{name.upper()}": value for name, value in topics.model_dump().items()}


def eval_stream(dataset: Path, splits: tuple[str, ...] = ("test_slack", "val")) -> list[Trajectory]:
    """Benign and hijacked AgentDojo trajectories of ``splits``, as a deployment would send."""
    out = []
    for line in (dataset / "trajectories.jsonl").read_text().splitlines():
        t = decode(line, Trajectory)
        if t.meta.get("split") in splits:
            out.append(t.model_copy(update={"source": "deployment"}))
    return out


def publish(bus: Bus, topics: Topics, trajectories: list[Trajectory]) -> dict[str, int | None]:
    """Publish every step; return ``trajectory/step -> label``."""
    labels: dict[str, int | None] = {}
    for t in trajectories:
        for e in step_events(t):
            publish_record(bus, topics.steps_deployment, e, key=e.trajectory_id)
            labels[f"{t.trajectory_id}/{e.step.step_id}"] = e.step.label
    bus.flush()
    return labels


def committed(settings: KafkaSettings, group: str, topic: str) -> int:
    """The offsets ``group`` has committed on ``topic``, summed over its partitions."""
    from kafka import KafkaConsumer, TopicPartition

    c = KafkaConsumer(**settings.client_options(), group_id=group, enable_auto_commit=False)
    try:
        parts = c.partitions_for_topic(topic) or set()
        return sum(c.committed(TopicPartition(topic, p)) or 0 for p in parts)
    finally:
        c.close()


@dataclass
class Outputs:
    """Everything the worker wrote, read as it arrives by a group of the test's own."""

    bus: KafkaBus
    topics: Topics
    group: str
    by_topic: dict[str, list[Message]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        t = self.topics
        self.consumer = self.bus.consumer(
            [t.scores, t.escalations, t.verdicts_rollout, t.deadletter], self.group)
        deadline = time.monotonic() + 30
        while not self.consumer.assigned and time.monotonic() < deadline:
            self._take(self.consumer.poll(0.2))
        assert self.consumer.assigned, "the reader did not join its group"

    def _take(self, batch: list[Message]) -> None:
        for m in batch:
            self.by_topic.setdefault(m.topic, []).append(m)

    def read_until(self, done: Callable[[Outputs], bool], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._take(self.consumer.poll(0.3))
            if done(self):
                return True
        return False

    def of(self, topic: str) -> list[Message]:
        return self.by_topic.get(topic, [])

    def keys(self, topic: str, tier: int | None = None) -> list[str]:
        """Idempotency keys of ``topic``'s records (of one tier), with repeats."""
        out = []
        for m in self.of(topic):
            if tier is None or json.loads(m.value).get("tier") == tier:
                out.append(m.header(H_IDEMPOTENCY) or "")
        return out

    def close(self) -> None:
        self.consumer.close()


@dataclass
class StreamProcess:
    """One ``monitor stream`` subprocess; its stderr goes to a file (``log()``)."""

    proc: subprocess.Popen[bytes]
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_for(self, text: str, timeout: float, count: int = 1) -> None:
        deadline = time.monotonic() + timeout
        while self.log().count(text) < count:
            if self.proc.poll() is not None:
                raise AssertionError(f"monitor stream exited {self.proc.returncode}:\n{self.log()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"no {text!r} within {timeout}s:\n{self.log()[-3000:]}")
            time.sleep(0.2)

    def terminate(self, timeout: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def screened(self) -> int:
        """Steps this process's screen stage (L0) scored, from its final stats line."""
        lines = [x for x in self.log().splitlines() if x.startswith("vigil stream: L0 scored ")]
        assert lines, self.log()[-3000:]
        return int(lines[-1].split()[4])


@pytest.fixture
def start_stream(
    broker: EmbeddedBroker, tiny_policy: Path, tmp_path: Path
) -> Iterator[Callable[..., StreamProcess]]:
    """Start ``monitor stream --policy TINY ARGS`` with ``VIGIL_HOME`` in a tmp dir."""
    started: list[StreamProcess] = []
    home = tmp_path / "home"
    home.mkdir()

    def start(topics: Topics, *args: str, name: str = "stream") -> StreamProcess:
        env = {k: v for k, v in os.environ.items() if not k.startswith("VIGIL_")}
        env.update(topic_env(topics))
        env.update({"VIGIL_HOME": str(home), "PYTHONPATH": str(ROOT),
                    "VIGIL_KAFKA_BOOTSTRAP_SERVERS": broker.bootstrap_servers})
        log = tmp_path / f"{name}-{len(started)}.log"
        proc = subprocess.Popen(
            [sys.executable, "-m", "monitor.cli", "stream", "--policy", str(tiny_policy), *args],
            env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=log.open("wb"))
        sp = StreamProcess(proc, log)
        started.append(sp)
        return sp

    yield start
    for sp in started:
        if sp.proc.poll() is None:
            sp.proc.kill()
            sp.proc.wait(10)
