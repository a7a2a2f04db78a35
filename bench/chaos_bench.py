"""Chaos, measured: kill -9 the pipeline's processes mid-stream, take the broker away, and
feed the screen stage garbage; then count what was lost, repeated, paged twice or stuck.

    python bench/chaos_bench.py                              # part "kill": 20 kills, 60 s outage
    python bench/chaos_bench.py --kills 3 --outage-s 15 --out /tmp/chaos.json    # a smoke run
    python bench/chaos_bench.py --part fuzz                  # 100,000 fuzzed records
    python bench/chaos_bench.py --part fuzz --records 5000 --fuzz-kills 1 --out /tmp/chaos.json

Both parts write their block (command, data, machine, config, figures, targets) into
``bench/results/chaos.json`` (``--out``), keeping the other part's block.

* **kill**: a durable Tansu broker (``file://`` storage in a temporary folder), the paging
  service as a subprocess (``monitor serve``; PostgreSQL, or SQLite with
  ``--paging-store sqlite``), and the worker stages ``screen``, ``review`` and ``recall``
  as separate ``monitor stream --role ...`` subprocesses. A producer sends held-out
  AgentDojo steps (``test_slack`` and ``val`` of the small build) at ``--rate`` steps/s,
  replaying them under fresh trajectory ids. ``--kills`` times, ``--burst`` extra steps go
  out at once (steady traffic leaves the stages idle most of the time; a backlog makes the
  kill land mid-batch), and 0.3-3 s later a random one of the stages and the paging
  service is killed with SIGKILL and started again at once; the next kill waits until the
  stage's committed offsets move again (the paging service: until it answers
  ``/healthz``), plus a random pause. Then the broker is killed with SIGKILL, stays
  away ``--outage-s`` and comes back on the same port. Traffic stops, the pipeline drains,
  and the bench counts lost steps (acknowledged to the producer, no tier-0 score),
  duplicate scores (records beyond the first per idempotency key), duplicate pages
  (alerts per dedup key, pages per trajectory), crashes (a process that exited by itself
  with a non-zero code), the recovery time of each kill, and for the outage: the workers'
  ALERT line and ``/healthz`` 503, whether they stayed up, and when scoring resumed.
* **fuzz**: ``--records`` fuzzed records (random bytes, truncated and mutated step events,
  deep nesting, NaN and Infinity, huge numbers, wrong types, odd JSON, odd headers,
  oversize records, a few huge-but-valid steps, 3 % valid steps; with the fuzzed ones
  that still validate, about 10 % are valid) on the deployment steps topic of a memory
  broker; one ``--role screen`` worker consumes them and is killed with SIGKILL
  ``--fuzz-kills`` times (at even fractions of the committed progress) and restarted.
  Counted: crashes, committed offset against the end of every partition (stuck
  offsets), dead letters per distinct bad input (and how many repeats a
  kill's redelivery of an uncommitted batch explains), bad inputs never dead-lettered,
  valid steps scored. What each record should come to is decided in this process by the
  same rules the stage uses (size limit, then ``streams.records.decode``).

Models: the tiny build of the worker tests (AgentDojo banking + slack, a 4-epoch world
model, a one-layer Gemma-3-270M probe, a calibrated policy with wide budgets), made under
``bench/.cache/chaos`` on first use (~1 min); ``--policy`` and ``--data`` use others.
Every address is on the loopback interface.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.machine import machine  # noqa: E402
from streams.broker import free_port  # noqa: E402

CACHE = ROOT / "bench" / ".cache" / "chaos"
DEFAULT_OUT = ROOT / "bench" / "results" / "chaos.json"
EVAL_SPLITS = ("test_slack", "val")
STAGES = ("screen", "review", "recall")
H_IDEMPOTENCY = "vigil-idempotency-key"
H_DLQ_REASON = "vigil-dlq-reason"


def say(msg: str) -> None:
    print(f"[chaos {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def _pct(part: float, whole: float) -> float:
    return round(100.0 * part / whole, 3) if whole else 0.0


def _summary(xs: Sequence[float]) -> dict[str, Any]:
    """n, median, max and each value (seconds, 0.1 s)."""
    if not xs:
        return {"n": 0}
    return {"n": len(xs), "median": round(statistics.median(xs), 1), "max": round(max(xs), 1),
            "values": [round(x, 1) for x in xs]}


# --- models and data ----------------------------------------------------------------------


@dataclass(frozen=True)
class Models:
    policy: Path
    data: Path
    kind: str  # what the policy is, in words (for the JSON)


def prepare_models(policy: str | None, data: str | None) -> Models:
    """The tiny build under ``bench/.cache/chaos`` (made on first use), or the given ones."""
    if policy:
        if not data:
            import vigil.paths

            data = str(vigil.paths.dataset("agentdojo"))
        return Models(Path(policy).expanduser(), Path(data).expanduser(), f"given: {policy}")
    CACHE.mkdir(parents=True, exist_ok=True)
    dataset = Path(data).expanduser() if data else CACHE / "agentdojo"
    t0 = time.perf_counter()
    if not (dataset / "manifest.json").exists():
        from worldmodel.datasets.agentdojo.build import build_agentdojo

        say(f"building the small AgentDojo set -> {dataset} (banking + slack, once)")
        build_agentdojo(dataset, suites=["banking", "slack"], attacks=["important_instructions"],
                        max_user_tasks=6, max_injection_tasks=3, progress=False)
    from monitor.crossfit import bundle_built

    wm = CACHE / "worldmodel"
    if not bundle_built(wm, "worldmodel"):
        from worldmodel.model import JEPAConfig
        from worldmodel.train import TrainConfig, train

        say(f"training the tiny world model -> {wm} (4 epochs, once)")
        small = JEPAConfig(latent_dim=32, hidden_dim=64, history=2, predictor_layers=1,
                           predictor_heads=2, use_images=False)
        train(TrainConfig(data=[str(dataset)], out=str(wm), epochs=4, batch_size=32,
                          text_cache=str(CACHE / "textcache"), model=small), log=lambda _: None)
    probes = CACHE / "probes"
    if not bundle_built(probes, "probes"):
        from probes.models import load_probe_model
        from probes.pipeline import train_probe

        say(f"training the tiny probe (Gemma-3-270M layer 3) -> {probes} (once)")
        train_probe(load_probe_model(), dataset, probes, layers=[3], train_limit=160,
                    n_splits=3, cache_dir=CACHE / "probe-cache", log=lambda _: None)
    out = CACHE / "policy.json"
    if not out.exists():
        from monitor.defaults import DefaultSizes, calibrate_default
        from monitor.tiers import policy_config_from_dict

        say(f"calibrating the tiny policy -> {out} (once)")
        config = policy_config_from_dict(
            {"tiers": {"L0": {"budget": 0.5}, "L1": {"budget": 0.2},
                       "L2": {"budget": 0.1, "signals": []}}})
        calibrate_default(config, [str(dataset)], out,
                          models={"worldmodel": str(wm), "probes": str(probes)},
                          sizes=DefaultSizes(1, (3,), 160, 300, 20), reviewer=False,
                          log=lambda _: None)
        say(f"tiny models ready in {time.perf_counter() - t0:.0f} s")
    return Models(out, dataset, "tiny (tests/conftest.py tiny_policy: 4-epoch world model, "
                  "Gemma-3-270M probe on layer 3, budgets L0 0.5 / L1 0.2 / L2 0.1, "
                  "no L2 reviewer)")


def eval_trajectories(data: Path) -> list[Any]:
    """The held-out AgentDojo trajectories (``test_slack`` and ``val``), as deployments."""
    from streams.records import Trajectory, read_jsonl

    return [t.model_copy(update={"source": "deployment"})
            for t in read_jsonl(data / "trajectories.jsonl", Trajectory)
            if t.meta.get("split") in EVAL_SPLITS]


# --- child processes ----------------------------------------------------------------------

_NOTE = re.compile(r"ALERT|is back|joined group|acknowledged again|waits for the broker|"
                   r"Traceback|failed|Error|PAGE |paging service on|consuming the batch again")


@dataclass
class Child:
    """One subprocess of the bench (a worker stage, the paging service): its output goes,
    timed, to ``log_path``; lines worth timing are kept as ``(t, start number, line)``."""

    name: str
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    clock: Callable[[], float]
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0
    expected_exit: bool = False  # we killed or stopped it: its exit is no crash
    notes: list[tuple[float, int, str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def restart(self) -> None:
        with self.lock:
            self.start()

    def start(self) -> None:
        self.proc = subprocess.Popen(
            self.argv, env=self.env, cwd=ROOT, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        self.starts += 1
        self.expected_exit = False
        threading.Thread(target=self._pump, args=(self.proc, self.starts), daemon=True,
                         name=f"chaos-log-{self.name}").start()

    def _pump(self, proc: subprocess.Popen[bytes], n: int) -> None:
        assert proc.stdout is not None
        with self.log_path.open("a", encoding="utf-8") as f:
            f.write(f"{self.clock():9.3f} --- start {n}, pid {proc.pid}\n")
            for raw in proc.stdout:
                line = raw.decode("utf-8", "replace").rstrip()
                t = self.clock()
                f.write(f"{t:9.3f} {line}\n")
                f.flush()
                if _NOTE.search(line) and len(self.notes) < 100_000:
                    self.notes.append((t, n, line))
            f.write(f"{self.clock():9.3f} --- exit {proc.wait()} (start {n})\n")

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill9(self) -> None:
        with self.lock:
            self.expected_exit = True
            if self.proc is not None and self.proc.poll() is None:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)

    def terminate(self, timeout_s: float = 60.0) -> int | None:
        """SIGTERM and wait; the exit code (None: it had to be killed)."""
        with self.lock:
            self.expected_exit = True
            if self.proc is None:
                return None
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
                return None

    def first_note(self, pattern: str, after: float, start: int | None = None) -> float | None:
        for t, n, line in list(self.notes):
            if t >= after and pattern in line and (start is None or n == start):
                return t
        return None

    def tail(self, n: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""


class Supervisor:
    """Notices a child that exited by itself: a non-zero exit is a crash (recorded with its
    log tail) and the child is started again, so one crash does not end the run; a clean
    exit is recorded, and restarted only with ``restart_clean``."""

    def __init__(self, children: list[Child], clock: Callable[[], float], *,
                 restart_clean: bool) -> None:
        self.children = children
        self.clock = clock
        self.restart_clean = restart_clean
        self.crashes: list[dict[str, Any]] = []
        self.clean_exits: list[dict[str, Any]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True, name="chaos-supervisor")

    def _run(self) -> None:
        while not self.stop.wait(0.2):
            for c in self.children:
                with c.lock:
                    proc = c.proc
                    if proc is None or c.expected_exit or proc.poll() is None:
                        continue
                    rc = proc.returncode
                time.sleep(0.3)  # let the log pump write the last lines
                with c.lock:
                    if c.expected_exit or c.proc is not proc:
                        continue  # stopped, or started again, in the meantime
                    if rc == 0:
                        self.clean_exits.append({"process": c.name,
                                                 "at_s": round(self.clock(), 1)})
                        c.expected_exit = True
                        if self.restart_clean:
                            say(f"{c.name} exited 0 unasked; starting it again")
                            c.start()
                        continue
                    self.crashes.append({"process": c.name, "exit_code": rc,
                                         "at_s": round(self.clock(), 1),
                                         "log_tail": c.tail(3000)})
                    say(f"CRASH: {c.name} exited {rc} by itself; starting it again")
                    c.start()


# --- Kafka helpers ------------------------------------------------------------------------


def kafka_settings(bootstrap: str, client_id: str, **extra: Any) -> Any:
    from streams.config import KafkaSettings

    return KafkaSettings(bootstrap_servers=bootstrap, client_id=client_id, **extra)


class Committed:
    """A group's committed offsets, read without joining the group."""

    def __init__(self, settings: Any, group: str, topics: Sequence[str], partitions: int) -> None:
        self.settings = settings
        self.group = group
        self.tps = [(t, p) for t in topics for p in range(partitions)]
        self._c: Any = None

    def read(self, timeout_ms: int = 3000) -> dict[tuple[str, int], int] | None:
        """``{(topic, partition): committed}`` (0 where none), or None if the broker did
        not answer."""
        from kafka import KafkaConsumer, TopicPartition

        try:
            if self._c is None:
                self._c = KafkaConsumer(**self.settings.client_options(), group_id=self.group,
                                        enable_auto_commit=False)
            return {(t, p): self._c.committed(TopicPartition(t, p), timeout_ms=timeout_ms) or 0
                    for t, p in self.tps}
        except Exception:  # noqa: BLE001 - a broker away; the next read tries again
            self.close()
            return None

    def close(self) -> None:
        c, self._c = self._c, None
        if c is not None:
            with contextlib.suppress(Exception):
                c.close(autocommit=False)


class ProgressWatch:
    """Each group's committed total, every ``every_s`` (a timeline per group)."""

    def __init__(self, readers: dict[str, Committed], clock: Callable[[], float],
                 every_s: float = 0.5) -> None:
        self.readers = readers
        self.clock = clock
        self.every_s = every_s
        self.timeline: dict[str, list[tuple[float, int]]] = {g: [] for g in readers}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True, name="chaos-progress")

    def _run(self) -> None:
        while not self.stop.wait(self.every_s):
            for name, r in self.readers.items():
                asked = self.clock()  # a read asked after an event cannot predate it
                got = r.read()
                if got is not None:
                    self.timeline[name].append((asked, sum(got.values())))

    def latest(self, name: str) -> int:
        tl = self.timeline[name]
        return tl[-1][1] if tl else 0

    def first_at_or_after(self, name: str, after: float) -> int | None:
        """The committed total of the first read asked at or after ``after``."""
        return next((v for t, v in list(self.timeline[name]) if t >= after), None)

    def first_above(self, name: str, value: int, after: float) -> float | None:
        """When the group's committed total first exceeded ``value`` at or after ``after``."""
        for t, total in list(self.timeline[name]):
            if t >= after and total > value:
                return t
        return None

    def close(self) -> None:
        self.stop.set()
        self.thread.join(10)
        for r in self.readers.values():
            r.close()


@dataclass(frozen=True)
class Seen:
    """One record the reader saw: when (bench clock), its producer timestamp (ms), its
    idempotency key, and the fields the figures need."""

    t: float
    ts_ms: int
    key: str
    tier: int | None = None
    step: str = ""  # trajectory_id/step_id
    origin: tuple[str, int, int, str] | None = None  # a dead letter's topic, partition,
    # offset and reason


class Reader:
    """Reads topics from the beginning by assignment (no group, nothing to rebalance when
    the broker goes away), one entry per (topic, partition, offset): a re-read after a
    reconnect counts nothing twice."""

    def __init__(self, settings: Any, topics: Sequence[str], partitions: int,
                 clock: Callable[[], float]) -> None:
        self.settings = settings
        self.topics = list(topics)
        self.partitions = partitions
        self.clock = clock
        self.seen: dict[str, dict[tuple[int, int], Seen]] = {t: {} for t in topics}
        self.lock = threading.Lock()
        self.last_record = clock()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True, name="chaos-reader")

    def _consumer(self) -> Any:
        from kafka import KafkaConsumer, TopicPartition

        c = KafkaConsumer(**self.settings.client_options(), enable_auto_commit=False,
                          max_partition_fetch_bytes=4 * 1_048_576, fetch_max_bytes=64 * 1_048_576)
        tps = [TopicPartition(t, p) for t in self.topics for p in range(self.partitions)]
        c.assign(tps)
        c.seek_to_beginning(*tps)
        return c

    def _run(self) -> None:
        c = None
        while not self.stop.is_set():
            try:
                if c is None:
                    c = self._consumer()
                batches = c.poll(timeout_ms=300, max_records=2000)
            except Exception as e:  # noqa: BLE001 - the broker went away: connect again
                say(f"reader: {type(e).__name__}: {e}; reconnecting")
                if c is not None:
                    with contextlib.suppress(Exception):
                        c.close(autocommit=False)
                c = None
                self.stop.wait(1.0)
                continue
            now = self.clock()
            with self.lock:
                for tp, records in batches.items():
                    for r in records:
                        self._take(tp.topic, tp.partition, r, now)
        if c is not None:
            with contextlib.suppress(Exception):
                c.close(autocommit=False)

    def _take(self, topic: str, partition: int, r: Any, now: float) -> None:
        where = (partition, r.offset)
        if where in self.seen[topic]:
            return
        self.last_record = now
        headers = {k: v for k, v in (r.headers or [])}
        key = headers.get(H_IDEMPOTENCY, b"").decode("utf-8", "replace")
        if H_DLQ_REASON in headers:  # a dead letter: where it came from, not what it holds
            with contextlib.suppress(ValueError):
                origin = (headers.get("vigil-dlq-topic", b"").decode("utf-8", "replace"),
                          int(headers.get("vigil-dlq-partition", b"-1")),
                          int(headers.get("vigil-dlq-offset", b"-1")),
                          headers[H_DLQ_REASON].decode("utf-8", "replace"))
                self.seen[topic][where] = Seen(now, int(r.timestamp or 0), key, origin=origin)
                return
        tier, step = None, ""
        with contextlib.suppress(ValueError, TypeError, AttributeError, KeyError,
                                 RecursionError):
            obj = json.loads(r.value)
            if "step" in obj:  # a step event (the steps topic)
                step = f"{obj['trajectory_id']}/{obj['step']['step_id']}"
            else:
                tier = obj.get("tier")
                step = f"{obj.get('trajectory_id')}/{obj.get('step_id')}"
        self.seen[topic][where] = Seen(now, int(r.timestamp or 0), key, tier, step)

    def records(self, topic: str) -> list[Seen]:
        with self.lock:
            return list(self.seen[topic].values())

    def close(self) -> None:
        self.stop.set()
        self.thread.join(15)


# --- part "kill" --------------------------------------------------------------------------


class StepProducer:
    """Sends step events at ``rate`` per second, ``concurrent`` trajectories interleaved,
    replaying ``trajectories`` under fresh ids. Steps are due on the clock whether or not
    the broker answers; the unacknowledged ones are kept and sent again, in order, once a
    metadata ping succeeds. ``acked``: step key -> when its flush was acknowledged."""

    def __init__(self, settings: Any, topic: str, trajectories: list[Any], rate: float,
                 clock: Callable[[], float], concurrent: int = 4) -> None:
        from streams.kafka import KafkaBus

        self.bus = KafkaBus(settings)
        self.topic = topic
        self.trajectories = trajectories
        self.rate = rate
        self.clock = clock
        self.concurrent = concurrent
        self.acked: dict[str, float] = {}
        self.generated = 0
        self.sends = 0  # publish calls, repeats after a failed flush included
        self.failed_flushes = 0
        self.resent = 0  # steps sent again after a failed flush
        self.unsent = 0  # steps due but not acknowledged when traffic stopped
        self.burst_sent = 0  # steps sent in bursts, on top of the rate
        self._burst = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True, name="chaos-producer")
        self._replay = 0
        self._next = 0
        self._slots: list[list[Any]] = []

    def _next_event(self) -> Any:
        from streams.records import step_events

        while len(self._slots) < self.concurrent:
            t = self.trajectories[self._next % len(self.trajectories)]
            if self._next % len(self.trajectories) == 0:
                self._replay += 1
            self._next += 1
            copy = t.model_copy(update={"trajectory_id": f"{t.trajectory_id}~r{self._replay}"})
            self._slots.append(step_events(copy))
        slot = self._slots.pop(0)
        event = slot.pop(0)
        if slot:
            self._slots.append(slot)
        return event

    def _run(self) -> None:
        from streams.bus import DeliveryError
        from streams.processor import publish_record

        t0 = time.monotonic()
        pending: list[Any] = []
        healthy = True
        while not self.stop.is_set():
            due = int(self.rate * (time.monotonic() - t0)) - (self.generated - self.burst_sent)
            due += self._burst
            self.burst_sent += self._burst
            self._burst = 0
            for _ in range(max(0, due)):
                pending.append(self._next_event())
                self.generated += 1
            if pending and not healthy:
                try:
                    self.bus.ping(1.0)
                    healthy = True
                except Exception:  # noqa: BLE001 - still away
                    pass
            if pending and healthy:
                for e in pending:
                    publish_record(self.bus, self.topic, e, key=e.trajectory_id)
                    self.sends += 1
                try:
                    self.bus.flush(10.0)
                except DeliveryError:
                    self.failed_flushes += 1
                    self.resent += len(pending)
                    self.bus.reset()
                    healthy = False
                else:
                    now = self.clock()
                    for e in pending:
                        self.acked.setdefault(f"{e.trajectory_id}/{e.step.step_id}", now)
                    pending = []
            self.stop.wait(max(0.02, 1.0 / self.rate / 2))
        self.unsent = len(pending)

    def burst(self, n: int) -> None:
        """Send ``n`` steps at once, on top of the steady rate (so a kill finds work)."""
        self._burst += n

    def close(self) -> None:
        self.stop.set()
        self.thread.join(30)
        with contextlib.suppress(Exception):
            self.bus.close()


def http_status(url: str, timeout_s: float = 1.0) -> int | None:
    """The HTTP status of GET ``url``; None when nothing answered."""
    import httpx

    try:
        return httpx.get(url, timeout=timeout_s).status_code
    except httpx.HTTPError:
        return None


def wait_until(check: Callable[[], bool], timeout_s: float, every_s: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(every_s)
    return check()


@dataclass
class PagingStore:
    """The paging service's database: a PostgreSQL database of the run's own, or SQLite."""

    url: str
    kind: str
    admin_url: str | None = None
    name: str | None = None

    @classmethod
    def make(cls, kind: str, postgres_url: str, folder: Path) -> PagingStore:
        if kind == "postgres":
            import psycopg

            name = f"vigil_chaos_{os.getpid()}_{int(time.time())}"
            try:
                with psycopg.connect(postgres_url, autocommit=True, connect_timeout=5) as conn:
                    conn.execute(f'CREATE DATABASE "{name}"')
            except psycopg.Error as e:
                say(f"PostgreSQL at {postgres_url} is not usable ({e}); using SQLite instead")
            else:
                base = postgres_url.rsplit("/", 1)[0]
                return cls(f"{base}/{name}", "postgresql", postgres_url, name)
        return cls(f"sqlite:///{folder / 'paging.db'}", "sqlite")

    def query(self, sql: str) -> list[Any]:
        from sqlalchemy import text

        from monitor.service.db import make_engine

        engine = make_engine(self.url)
        try:
            with engine.connect() as conn:
                return list(conn.execute(text(sql)).all())
        finally:
            engine.dispose()

    def drop(self) -> None:
        if self.admin_url and self.name:
            import psycopg

            with contextlib.suppress(psycopg.Error), psycopg.connect(
                    self.admin_url, autocommit=True, connect_timeout=5) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')


def _topic_env(topics: Any) -> dict[str, str]:
    return {f"VIGIL_TOPIC_{k.upper()}": v for k, v in topics.model_dump().items()}


def _child_env(topics: Any, torch_threads: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("VIGIL_") or k == "VIGIL_HOME"}
    env.update(_topic_env(topics))
    env.update({"PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1",
                "OMP_NUM_THREADS": str(torch_threads), "MKL_NUM_THREADS": str(torch_threads),
                "TOKENIZERS_PARALLELISM": "false"})
    return env


def run_kill(args: argparse.Namespace) -> dict[str, Any]:
    from streams.broker import EmbeddedBroker

    rng = random.Random(args.seed)
    models = prepare_models(args.policy, args.data)
    trajectories = eval_trajectories(models.data)
    if not trajectories:
        raise SystemExit(f"no {'/'.join(EVAL_SPLITS)} trajectories in {models.data}")
    work = Path(tempfile.mkdtemp(prefix="chaos-kill-", dir=_runs_dir()))
    say(f"part kill: logs and broker storage in {work}")
    t_zero = time.monotonic()

    def clock() -> float:
        return time.monotonic() - t_zero

    with EmbeddedBroker(storage=f"file://{work / 'broker'}", ready_timeout_s=30) as broker:
        say(f"broker (Tansu, file storage) on {broker.bootstrap_servers}")
        store = PagingStore.make(args.paging_store, args.postgres_url, work)
        try:
            return _kill_through(args, broker, store, models, trajectories, work, clock, rng)
        finally:
            if not args.keep:
                store.drop()


def _kill_through(args: argparse.Namespace, broker: Any, store: PagingStore, models: Models,
                  trajectories: list[Any], work: Path, clock: Callable[[], float],
                  rng: random.Random) -> dict[str, Any]:
    """Start the paging service and the stages, send traffic, kill, take the broker away,
    drain, and count."""
    from monitor.service.auth import provision_store
    from streams.config import Topics
    from streams.kafka import KafkaBus

    topics = Topics(**{k: f"chaos.{v}" for k, v in Topics().model_dump().items()})
    bootstrap = broker.bootstrap_servers
    settings = kafka_settings(bootstrap, "chaos-bench")
    admin_bus = KafkaBus(settings)
    admin_bus.ensure_topics(topics.all())
    admin_bus.close()
    partitions = settings.partitions

    token = provision_store(store.url, {"chaos-worker": "producer"})["chaos-worker"]
    paging_port = free_port()
    paging_url = f"http://127.0.0.1:{paging_port}"
    env = _child_env(topics, args.torch_threads)
    paging_env = dict(env, VIGIL_PAGING_POLL_INTERVAL_S="1",
                      VIGIL_PAGING_SECRET_KEY="vigil-chaos-bench")
    py = sys.executable
    children: dict[str, Child] = {
        "paging": Child("paging", [py, "-m", "monitor.cli", "serve", "--host", "127.0.0.1",
                                   "--port", str(paging_port), "--database-url", store.url,
                                   "--log-level", "warning"],
                        paging_env, work / "paging.log", clock)}
    metrics_ports: dict[str, int] = {}
    group = "chaos"
    for role in args.stages:
        metrics_ports[role] = free_port()
        argv = [py, "-m", "monitor.cli", "stream", "--role", role, "--policy", str(models.policy),
                "--group", group, "--bootstrap-servers", bootstrap, "--batch-size",
                str(args.batch_size), "--metrics-port", str(metrics_ports[role])]
        if role == "review":
            argv += ["--paging-url", paging_url, "--paging-token", token]
        children[role] = Child(role, argv, env, work / f"{role}.log", clock)
    inputs = {"screen": [topics.steps_deployment], "review": [topics.escalations],
              "recall": [topics.scores, topics.labels]}
    readers = {r: Committed(settings, f"{group}-{r}", inputs[r], partitions) for r in args.stages}
    progress = ProgressWatch(readers, clock)
    supervisor = Supervisor(list(children.values()), clock, restart_clean=True)
    reader = Reader(settings, [topics.steps_deployment, topics.scores, topics.escalations],
                    partitions, clock)
    producer = StepProducer(kafka_settings(bootstrap, "chaos-producer", max_block_ms=2000),
                            topics.steps_deployment, trajectories, args.rate, clock)
    kills: list[dict[str, Any]] = []
    outage: dict[str, Any] = {}
    t_start = time.perf_counter()
    try:
        for c in children.values():
            c.start()
        if not wait_until(lambda: http_status(f"{paging_url}/healthz") == 200, 60):
            raise SystemExit(f"the paging service did not answer within 60 s:\n"
                             f"{children['paging'].tail()}")
        for role in args.stages:
            stage = children[role]

            def joined(stage: Child = stage) -> bool:
                return stage.first_note("joined group", 0) is not None

            if not wait_until(joined, 180):
                raise SystemExit(f"the {role} stage did not join its group within 180 s:\n"
                                 f"{stage.tail()}")
        say(f"paging service on {paging_url} ({store.kind}); stages up: "
            f"{', '.join(args.stages)} ({clock():.0f} s)")
        supervisor.thread.start()
        progress.thread.start()
        reader.thread.start()
        producer.thread.start()
        say(f"traffic: {args.rate:g} steps/s from {len(trajectories)} held-out trajectories "
            f"(replayed under fresh ids); warming up {args.warmup_s:.0f} s")
        time.sleep(args.warmup_s)

        plan = [args.targets[i % len(args.targets)] for i in range(args.kills)]
        rng.shuffle(plan)
        for i, target in enumerate(plan, 1):
            if args.burst:  # a backlog, so the kill lands mid-batch (or mid-page)
                producer.burst(args.burst)
                time.sleep(rng.uniform(args.burst_kill_min_s, args.burst_kill_max_s))
            kills.append(_kill_one(i, target, children[target], progress, paging_url, clock,
                                   args.recover_timeout_s))
            k = kills[-1]
            rec = k["recovered_s"]
            say(f"kill {i}/{len(plan)}: {target} -> "
                + (f"progress again after {rec:.1f} s" if rec is not None
                   else f"NOT recovered within {args.recover_timeout_s:.0f} s")
                + f"; acked {len(producer.acked)}, scored "
                f"{len(_keys(reader, topics.scores, 0))}")
            time.sleep(rng.uniform(args.gap_min_s, args.gap_max_s))

        if args.outage_s > 0:
            outage = _broker_outage(args, broker, children, metrics_ports, progress, reader,
                                    producer, topics, clock)

        say("stopping traffic; draining")
        producer.close()
        t_drain = clock()
        drained = wait_until(lambda: _drained(reader, producer, topics, store), args.drain_s,
                             every_s=2.0)
        drain_s = clock() - t_drain
        say(("drained" if drained else f"NOT drained within {args.drain_s:.0f} s")
            + f" in {drain_s:.0f} s")
        time.sleep(3.0)  # stragglers (repeated outputs of the last batches)
    finally:
        supervisor.stop.set()
        producer.stop.set()
        stops = {}
        for name, c in children.items():
            rc = c.terminate(60)
            stops[name] = rc
        time.sleep(1.0)
        reader.close()
        progress.close()
        with contextlib.suppress(Exception):
            producer.close()

    duration = time.perf_counter() - t_start
    _paging_kill_effects(kills, children.get("review"))
    figures = _kill_figures(reader, producer, topics, store, kills, outage, supervisor,
                            stops, drained, drain_s, duration)
    return {
        "measured": "kill -9 of worker stages and the paging service mid-stream, then a "
                    "broker kill -9 and restart, under steady traffic; what was lost, "
                    "repeated, paged twice",
        "data": {"dataset": str(models.data.relative_to(ROOT) if models.data.is_relative_to(ROOT)
                                else models.data),
                 "splits": list(EVAL_SPLITS), "trajectories": len(trajectories),
                 "steps_per_replay": sum(len(t.steps) for t in trajectories),
                 "policy": models.kind},
        "config": {"rate_steps_per_s": args.rate, "kills": args.kills,
                   "burst_before_each_kill": args.burst,
                   "kill_after_burst_s": [args.burst_kill_min_s, args.burst_kill_max_s],
                   "targets": list(args.targets), "stages": list(args.stages),
                   "outage_s": args.outage_s, "warmup_s": args.warmup_s,
                   "gap_s": [args.gap_min_s, args.gap_max_s], "batch_size": args.batch_size,
                   "broker": "Tansu, file:// storage (EmbeddedBroker.kill/restart)",
                   "paging_store": store.kind, "partitions": partitions,
                   "torch_threads_per_worker": args.torch_threads, "seed": args.seed,
                   "logs": str(work)},
        "figures": figures,
        "targets": _kill_targets(figures, args.outage_s > 0),
    }


def _runs_dir() -> Path:
    d = CACHE / "runs"
    d.mkdir(parents=True, exist_ok=True)
    return d


def _keys(reader: Reader, topic: str, tier: int | None = None) -> set[str]:
    return {s.key for s in reader.records(topic) if tier is None or s.tier == tier}


def _kill_one(i: int, target: str, child: Child, progress: ProgressWatch, paging_url: str,
              clock: Callable[[], float], timeout_s: float) -> dict[str, Any]:
    """SIGKILL ``child``, start it again at once, and wait until it works again: a stage's
    committed offsets move past where they were, the paging service answers /healthz."""
    was_alive = child.alive
    child.kill9()
    t_kill = clock()
    child.restart()  # at once: a restarted stage needs seconds before it can commit
    start_no = child.starts
    out: dict[str, Any] = {"n": i, "target": target, "at_s": round(t_kill, 1),
                           "was_running": was_alive}
    if target == "paging":
        ok = wait_until(lambda: http_status(f"{paging_url}/healthz") == 200, timeout_s)
        out["recovered_s"] = round(clock() - t_kill, 2) if ok else None
        out["how"] = "the restarted service answers GET /healthz 200"
        return out  # when the review stage paged again: _paging_kill_effects
    # the group's committed total as the dead member left it: the first read after the kill
    wait_until(lambda: progress.first_at_or_after(target, t_kill) is not None, 30, 0.1)
    before = progress.first_at_or_after(target, t_kill) or 0
    ok = wait_until(lambda: progress.first_above(target, before, t_kill) is not None, timeout_s,
                    every_s=0.25)
    t_ok = progress.first_above(target, before, t_kill)
    joined = child.first_note("joined group", t_kill, start_no)
    out["recovered_s"] = round(t_ok - t_kill, 2) if ok and t_ok is not None else None
    out["rejoined_s"] = round(joined - t_kill, 2) if joined is not None else None
    out["committed_before"] = before
    out["how"] = "the stage's group commits past its offsets at the kill"
    return out


def _paging_kill_effects(kills: list[dict[str, Any]], review: Child | None) -> None:
    """For each paging-service kill: when the review stage next paged (its first PAGE
    line after the kill) and how many batches it consumed again meanwhile."""
    if review is None:
        return
    for k, nxt in zip(kills, [*kills[1:], None], strict=True):
        if k["target"] != "paging":
            continue
        until = nxt["at_s"] if nxt is not None else math.inf
        paged = review.first_note("PAGE ", k["at_s"])
        k["review_paged_again_s"] = (round(paged - k["at_s"], 2)
                                     if paged is not None and paged < until else None)
        k["review_batches_consumed_again"] = sum(
            1 for t, _, line in list(review.notes)
            if k["at_s"] <= t < until and "consuming the batch again" in line)


def _broker_outage(args: argparse.Namespace, broker: Any, children: dict[str, Child],
                   ports: dict[str, int], progress: ProgressWatch, reader: Reader,
                   producer: StepProducer, topics: Any,
                   clock: Callable[[], float]) -> dict[str, Any]:
    """Kill the broker (SIGKILL), keep it away ``outage_s``, start it on the same port;
    watch the workers' ALERT lines, /healthz and liveness, and when scoring resumes."""
    stages = list(ports)
    scored_before = _keys(reader, topics.scores, 0)
    committed_before = {r: progress.latest(r) for r in stages}
    health: dict[str, list[tuple[float, int | None]]] = {r: [] for r in stages}
    alive_throughout = {r: True for r in list(children)}
    starts_before = {n: c.starts for n, c in children.items()}
    stop = threading.Event()

    def poll_health() -> None:
        while not stop.wait(0.25):
            for r in stages:
                health[r].append((clock(), http_status(
                    f"http://127.0.0.1:{ports[r]}/healthz", timeout_s=0.5)))
            for n, c in children.items():
                if not c.alive:
                    alive_throughout[n] = False

    poller = threading.Thread(target=poll_health, daemon=True, name="chaos-health")
    poller.start()
    say(f"broker: kill -9, away for {args.outage_s:.0f} s")
    t_kill = clock()
    broker.kill()
    time.sleep(max(0.0, args.outage_s - (clock() - t_kill)))
    alerts = {r: children[r].first_note("ALERT the broker does not answer", t_kill)
              for r in stages}
    t_back_start = clock()
    broker.restart()
    t_back = clock()
    wall_back_ms = time.time() * 1000
    say(f"broker: back on {broker.bootstrap_servers} after {t_back - t_kill:.0f} s "
        f"(restart took {t_back - t_back_start:.1f} s); ALERT after "
        + ", ".join(f"{r} {a - t_kill:.1f} s" if a is not None else f"{r} none"
                    for r, a in alerts.items()))

    def new_score_after() -> float | None:
        """Seconds from the return to the first new tier-0 score made after it (its
        producer timestamp: when the screen stage published it)."""
        made = [s.ts_ms for s in reader.records(topics.scores)
                if s.tier == 0 and s.key not in scored_before and s.ts_ms >= wall_back_ms]
        return (min(made) - wall_back_ms) / 1000 if made else None

    wait_until(lambda: new_score_after() is not None, args.recover_timeout_s, every_s=0.5)
    wait_until(lambda: all(progress.first_above(r, committed_before[r], t_back) is not None
                           for r in stages), args.recover_timeout_s, every_s=0.5)
    wait_until(lambda: all(health[r] and health[r][-1][1] == 200 for r in stages), 30)
    stop.set()
    poller.join(5)
    first_new = new_score_after()
    # end to end: the first tier-0 score of a step acknowledged to the producer after the return
    acked_after = {k for k, t in producer.acked.items() if t >= t_back}
    e2e = [s.ts_ms for s in reader.records(topics.scores)
           if s.tier == 0 and s.step in acked_after]
    first_ack = min((t for t in producer.acked.values() if t >= t_back), default=None)
    committing = {r: progress.first_above(r, committed_before[r], t_back) for r in stages}
    first_503 = {r: next((t for t, s in health[r] if t >= t_kill and s == 503), None)
                 for r in stages}
    back_200 = {r: next((t for t, s in health[r] if t >= t_back and s == 200), None)
                for r in stages}
    unanswered = {r: sum(1 for t, s in health[r] if s is None) for r in stages}
    restarted = {n: c.starts - starts_before[n] for n, c in children.items()}

    def rel(t: float | None, since: float) -> float | None:
        return round(t - since, 2) if t is not None else None

    return {
        "outage_s": round(t_back - t_kill, 1),
        "restart_took_s": round(t_back - t_back_start, 2),
        "alert_line_s": {r: rel(a, t_kill) for r, a in alerts.items()},
        "healthz_503_s": {r: rel(t, t_kill) for r, t in first_503.items()},
        "healthz_200_again_after_return_s": {r: rel(t, t_back) for r, t in back_200.items()},
        "healthz_polls_unanswered": unanswered,
        "processes_alive_throughout": alive_throughout,
        "processes_restarted_during_outage": restarted,
        "first_new_tier0_score_after_return_s": None if first_new is None
        else round(first_new, 2),
        "first_score_of_a_step_sent_after_return_s":
            round((min(e2e) - wall_back_ms) / 1000, 2) if e2e else None,
        "bench_producer_first_ack_after_return_s": rel(first_ack, t_back),
        "stage_commits_again_after_return_s": {r: rel(t, t_back) for r, t in committing.items()},
        "producer_failed_flushes": producer.failed_flushes,
    }


def _drained(reader: Reader, producer: StepProducer, topics: Any, store: PagingStore) -> bool:
    """Every acknowledged step has its tier-0 score, every tier-2 escalation its L2 score,
    every tier-3 step an alert in the paging service."""
    scored = {s.step for s in reader.records(topics.scores) if s.tier == 0}
    if not set(producer.acked) <= scored:
        return False
    escalations = reader.records(topics.escalations)
    up2 = {s.step for s in escalations if s.tier == 2}
    done2 = {s.step for s in reader.records(topics.scores) if s.tier == 2}
    if not up2 <= done2:
        return False
    up3 = {s.step for s in escalations if s.tier == 3}
    try:
        alerted = {r[0] for r in store.query("SELECT dedup_key FROM alerts")}
    except Exception:  # noqa: BLE001 - the store is busy; ask again
        return False
    return up3 <= alerted


def _kill_figures(reader: Reader, producer: StepProducer, topics: Any, store: PagingStore,
                  kills: list[dict[str, Any]], outage: dict[str, Any], supervisor: Supervisor,
                  stops: dict[str, int | None], drained: bool, drain_s: float,
                  duration: float) -> dict[str, Any]:
    scores = reader.records(topics.scores)
    escalations = reader.records(topics.escalations)
    inputs = Counter(s.step for s in reader.records(topics.steps_deployment))
    scored0 = {s.step for s in scores if s.tier == 0}
    lost = sorted(set(producer.acked) - scored0)
    by_key = Counter(s.key for s in scores)
    dup_scores = sum(n - 1 for n in by_key.values())
    # repeats a producer resend explains: a step written twice is scored twice
    beyond_inputs = sum(max(0, n - inputs.get(k.rsplit("/", 1)[0], 1)) for k, n in by_key.items())
    esc_keys = Counter(s.key for s in escalations)
    up2 = {s.step for s in escalations if s.tier == 2}
    done2 = {s.step for s in scores if s.tier == 2}
    tier3 = {s.step for s in escalations if s.tier == 3}
    alerts = store.query("SELECT dedup_key, trigger_count FROM alerts")
    alert_keys = Counter(r[0] for r in alerts)
    pages_per_traj = Counter(r[0] for r in store.query("SELECT trajectory_id FROM pages"))
    dup_alerts = {k: n for k, n in alert_keys.items() if n > 1}
    dup_pages = {k: n for k, n in pages_per_traj.items() if n > 1}
    recovery: dict[str, list[float]] = {}
    for k in kills:
        if k["recovered_s"] is not None:
            recovery.setdefault(k["target"], []).append(k["recovered_s"])
    # uvicorn re-raises a SIGTERM once it has shut down gracefully: -15 is its clean stop
    clean = {n: (0, -signal.SIGTERM) if n == "paging" else (0,) for n in stops}
    unclean = {n: rc for n, rc in stops.items() if rc not in clean[n]}
    return {
        "duration_s": round(duration, 1),
        "steps_generated": producer.generated,
        "steps_acknowledged": len(producer.acked),
        "steps_on_topic": len(inputs),
        "step_records_on_topic": sum(inputs.values()),
        "steps_written_twice_by_producer_resends": sum(1 for n in inputs.values() if n > 1),
        "steps_scored_tier0": len(scored0),
        "lost_steps": len(lost),
        "lost_step_keys": lost[:50],
        "score_records": len(scores),
        "unique_scores": len(by_key),
        "duplicate_scores": dup_scores,
        "duplicate_scores_pct": _pct(dup_scores, len(by_key)),
        "duplicate_scores_beyond_input_repeats_pct": _pct(beyond_inputs, len(by_key)),
        "score_records_per_tier": dict(sorted(Counter(str(s.tier) for s in scores).items())),
        "escalation_records": len(escalations),
        "duplicate_escalations_pct": _pct(sum(n - 1 for n in esc_keys.values()), len(esc_keys)),
        "tier2_escalations": len(up2),
        "tier2_escalations_without_L2_score": len(up2 - done2),
        "tier3_steps": len(tier3),
        "alerts": len(alerts),
        "pages": sum(pages_per_traj.values()),
        "tier3_steps_without_alert": len(tier3 - set(alert_keys)),
        "alerts_without_tier3_escalation": len(set(alert_keys) - tier3),
        "duplicate_pages": len(dup_alerts) + len(dup_pages),
        "duplicate_alert_keys": dup_alerts,
        "trajectories_with_two_pages": dup_pages,
        "page_triggers_deduplicated": sum(int(r[1]) - 1 for r in alerts),
        "crashes": len(supervisor.crashes),
        "crash_details": supervisor.crashes,
        "exits_0_unasked": supervisor.clean_exits,
        "exit_codes_on_sigterm_at_the_end": stops,
        "unclean_stops_on_sigterm": unclean,
        "kills": kills,
        "kills_not_recovered": sum(1 for k in kills if k["recovered_s"] is None),
        "recovery_s": {t: _summary(v) for t, v in sorted(recovery.items())},
        "broker_outage": outage,
        "drained": drained,
        "drain_s": round(drain_s, 1),
        "producer": {"sends": producer.sends, "steps_in_bursts": producer.burst_sent,
                     "failed_flushes": producer.failed_flushes,
                     "steps_resent": producer.resent,
                     "unsent_at_stop": producer.unsent},
    }


def _kill_targets(f: dict[str, Any], with_outage: bool) -> dict[str, Any]:
    out: dict[str, Any] = {
        "lost_steps_0": f["lost_steps"] == 0,
        "duplicate_pages_0": f["duplicate_pages"] == 0,
        "crashes_0": f["crashes"] == 0,
        "duplicate_scores_pct_at_most_1": f["duplicate_scores_pct"] <= 1.0,
    }
    o = f["broker_outage"]
    if with_outage and o:
        alerts = [v for v in o["alert_line_s"].values()]
        out["outage_workers_alive"] = all(o["processes_alive_throughout"].values())
        out["outage_alert_within_10_s"] = all(a is not None and a <= 10 for a in alerts)
        first = o["first_new_tier0_score_after_return_s"]
        out["outage_resumes_within_30_s"] = first is not None and first <= 30
    return out


# --- part "fuzz" --------------------------------------------------------------------------

MIX = {  # share of the records (oversize and huge-but-valid come in fixed small numbers)
    "valid": 0.03, "random_bytes": 0.17, "truncated": 0.14, "mutated": 0.16,
    "deep_nesting": 0.08, "nan_infinity": 0.08, "huge_numbers": 0.08, "wrong_types": 0.14,
    "odd_json": 0.08, "odd_headers": 0.04,
}


@dataclass(frozen=True)
class Fuzzed:
    category: str
    key: str | None
    value: bytes
    headers: list[tuple[str, bytes]]


class Fuzzer:
    """Fuzzed records from real step events (``base``: dicts of encoded step events)."""

    def __init__(self, base: list[dict[str, Any]], rng: random.Random, max_bytes: int) -> None:
        self.base = base
        self.rng = rng
        self.max_bytes = max_bytes
        self.n = 0

    def _event(self) -> dict[str, Any]:
        self.n += 1
        e = json.loads(json.dumps(self.rng.choice(self.base)))
        e["trajectory_id"] = f"fz-{self.n}-{e['trajectory_id'][-24:]}"
        return e

    def _valid_bytes(self) -> tuple[str, bytes]:
        e = self._event()
        return e["trajectory_id"], json.dumps(e).encode()

    def make(self, category: str) -> Fuzzed:
        r = self.rng
        valid_key, value = self._valid_bytes()
        key: str | None = valid_key
        headers: list[tuple[str, bytes]] = []
        if category == "valid":
            pass
        elif category == "random_bytes":
            value = r.randbytes(r.choice([0, 1, r.randint(2, 64), r.randint(64, 4096)]))
            key = r.choice([None, valid_key, r.randbytes(8).hex()])
        elif category == "truncated":
            value = value[: r.randrange(len(value))]
        elif category == "mutated":
            b = bytearray(value)
            for _ in range(r.randint(1, 8)):
                op, i = r.randrange(5), r.randrange(len(b))
                if op == 0:
                    b[i] = r.randrange(256)
                elif op == 1:
                    b.insert(i, r.randrange(256))
                elif op == 2:
                    del b[i: i + r.randint(1, 40)]
                elif op == 3:
                    j = r.randrange(len(b))
                    b[i:i] = b[j: j + r.randint(1, 40)]
                else:
                    b[i] = r.choice(b'{}[]",:\\0e-')
                if not b:
                    b = bytearray(b"{")
            value = bytes(b)
        elif category == "deep_nesting":
            d = r.choice([65, 100, 1000, 10_000, 100_000])
            shape = r.randrange(4)
            if shape == 0:
                value = b'{"a":' * d + b"1" + b"}" * d
            elif shape == 1:
                value = b"[" * d + b"]" * d
            elif shape == 2:
                value = b"[" * d  # never closed
            else:
                e = json.loads(value)
                e["meta"] = {"deep": "@@"}
                value = json.dumps(e).encode().replace(b'"@@"', b"[" * d + b"]" * d)
        elif category == "nan_infinity":
            e = json.loads(value)
            lit = r.choice([b"NaN", b"Infinity", b"-Infinity"])
            where = r.randrange(3)
            if where == 0:
                value = json.dumps(e).encode().replace(
                    b'"index": ' + str(e["step"]["index"]).encode(), b'"index": ' + lit, 1)
            elif where == 1:
                e["meta"] = {"x": "@@"}
                value = json.dumps(e).encode().replace(b'"@@"', lit)
            else:
                e["step"]["observation"] = {"value": "@@"}
                value = json.dumps(e).encode().replace(b'"@@"', lit)
        elif category == "huge_numbers":
            e = json.loads(value)
            lit = r.choice([b"1e400", b"-1e999", b"9" * r.randint(20, 30),
                            b"9" * r.randint(4400, 20_000), b"1" + b"0" * 5000 + b".5",
                            b"123456789012345678901234567890e300"])
            e["step"]["index"] = "@@" if r.random() < 0.5 else e["step"]["index"]
            e["meta"] = {"n": "@@"}
            value = json.dumps(e).encode().replace(b'"@@"', lit)
        elif category == "wrong_types":
            e = json.loads(value)
            odd = r.choice([None, 1, -1, 1.5, "x", "", [], {}, True, [1, 2], {"a": 1}])
            path = r.choice([("trajectory_id",), ("step",), ("step", "step_id"),
                             ("step", "index"), ("step", "action"), ("step", "action", "text"),
                             ("step", "action", "tool"), ("step", "role"), ("source",),
                             ("final",), ("meta",), ("schema_version",), ("step", "label"),
                             ("step", "observation"), ("trajectory_label",)])
            target = e
            for p in path[:-1]:
                target = target[p]
            if r.random() < 0.2:
                target.pop(path[-1], None)
            else:
                target[path[-1]] = odd
            value = json.dumps(e).encode()
            if r.random() < 0.05:
                value = json.dumps([e, e]).encode()  # a list of events, not one
        elif category == "odd_json":
            value = r.choice([
                b"", b" ", b"\n", b"null", b"[]", b"{}", b'"x"', b"123", b"true", b"-0",
                b"\xef\xbb\xbf" + value,  # a byte-order mark
                value + value,  # two documents
                value.replace(b'"trajectory_id": "', b'"trajectory_id": "\\ud800', 1),
                value.replace(b'"trajectory_id": "', b'"trajectory_id": "\xff\xfe', 1),
                value.replace(b'{"', b'{"trajectory_id": "dup", "', 1),  # a repeated key
                value.replace(b'"', b"'"), value[:-1] + b",}", b"\x00" * 64,
                b'{"' + b"k" * 100_000 + b'": 1}',
            ])
        elif category == "odd_headers":
            if r.random() < 0.8:
                value = value[: r.randrange(len(value))]
            headers = [(r.choice(["", "x", "vigil-dlq-reason", "vigil-idempotency-key",
                                  "vigil-kind", "\u00e9\u00e8", "h" * 300]),
                        r.randbytes(r.randint(0, 200))) for _ in range(r.randint(1, 120))]
        elif category == "oversize":
            e = json.loads(value)
            e["step"]["action"]["text"] = "x" * r.randint(self.max_bytes + 1,
                                                          int(self.max_bytes * 1.5))
            value = json.dumps(e).encode()
        elif category == "huge_valid":
            e = json.loads(value)
            words = " ".join(r.choice(["transfer", "money", "to", "the", "account", "IBAN",
                                       "please", "ignore", "previous", "instructions"])
                             for _ in range(r.randint(20_000, 60_000)))
            e["step"]["action"]["text"] = words
            value = json.dumps(e).encode()
        else:
            raise ValueError(category)
        return Fuzzed(category, key, value, headers)


def expected_outcome(value: bytes, max_bytes: int) -> tuple[bool, str, str]:
    """What the screen stage should do with ``value``: (valid, step key, reason kind)."""
    from streams.records import RecordError, StepEvent, decode

    if len(value) > max_bytes:
        return False, "", "oversize"
    try:
        e = decode(value, StepEvent)
    except RecordError:
        return False, "", "invalid"
    except Exception as exc:  # noqa: BLE001 - decode's contract is RecordError
        return False, "", f"invalid ({type(exc).__name__} escaped decode)"
    return True, f"{e.trajectory_id}/{e.step.step_id}", ""


def run_fuzz(args: argparse.Namespace) -> dict[str, Any]:
    from streams.broker import EmbeddedBroker
    from streams.records import step_events

    rng = random.Random(args.seed)
    models = prepare_models(args.policy, args.data)
    work = Path(tempfile.mkdtemp(prefix="chaos-fuzz-", dir=_runs_dir()))
    say(f"part fuzz: logs in {work}")
    t_zero = time.monotonic()

    def clock() -> float:
        return time.monotonic() - t_zero

    from streams.records import Trajectory, encode, read_jsonl

    base = [json.loads(encode(e))
            for t in read_jsonl(models.data / "trajectories.jsonl", Trajectory)
            for e in step_events(t.model_copy(update={"source": "deployment"}))]
    from streams.config import KafkaSettings

    # the stages' limit: the workers run with the default (no VIGIL_KAFKA_* reaches them)
    fuzzer = Fuzzer(base, rng, KafkaSettings.model_fields["max_record_bytes"].default)
    n_oversize = max(1, round(args.records * 0.0002))
    n_huge = max(1, round(args.records * 0.00005))
    cats = list(MIX)
    plan = rng.choices(cats, weights=[MIX[c] for c in cats],
                       k=args.records - n_oversize - n_huge)
    plan += ["oversize"] * n_oversize + ["huge_valid"] * n_huge
    rng.shuffle(plan)

    with EmbeddedBroker(ready_timeout_s=30) as broker:
        return _fuzz_through(args, broker, models, plan, fuzzer, work, clock)


def _fuzz_through(args: argparse.Namespace, broker: Any, models: Models, plan: list[str],
                  fuzzer: Fuzzer, work: Path, clock: Callable[[], float]) -> dict[str, Any]:
    """Produce ``plan``'s records onto a broker of the run's own, screen them with a worker
    killed -9 ``--fuzz-kills`` times, and count."""
    from kafka import KafkaProducer

    from streams.config import Topics
    from streams.kafka import KafkaBus

    topics = Topics(**{k: f"chaos.{v}" for k, v in Topics().model_dump().items()})
    bootstrap = broker.bootstrap_servers
    settings = kafka_settings(bootstrap, "chaos-fuzz")
    max_bytes = fuzzer.max_bytes
    bus = KafkaBus(settings)
    bus.ensure_topics(topics.all())
    bus.close()
    partitions = settings.partitions
    say(f"broker (Tansu, memory) on {bootstrap}; producing {args.records:,} fuzzed records")

    producer = KafkaProducer(bootstrap_servers=bootstrap, client_id="chaos-fuzz-producer",
                             acks="all", linger_ms=20, batch_size=512 * 1024,
                             max_request_size=4 * 1_048_576)
    t0 = time.perf_counter()
    sent: list[tuple[Fuzzed, Any]] = []
    expect: Expected = {}
    refused_by_producer: Counter[str] = Counter()
    for i, cat in enumerate(plan, 1):
        rec = fuzzer.make(cat)
        try:
            fut = producer.send(topics.steps_deployment, value=rec.value,
                                key=rec.key.encode() if rec.key is not None else None,
                                headers=rec.headers)
        except Exception:  # noqa: BLE001 - a record the client itself refuses never lands
            refused_by_producer[cat] += 1
            continue
        sent.append((rec, fut))
        if i % 10_000 == 0 or i == len(plan):
            producer.flush()
            for r, f in sent:
                try:
                    md = f.get(timeout=60)
                except Exception:  # noqa: BLE001
                    refused_by_producer[r.category] += 1
                    continue
                valid, key, reason = expected_outcome(r.value, max_bytes)
                expect[(md.partition, md.offset)] = (r.category, valid, key, reason)
            sent = []
            say(f"produced {i:,}/{len(plan):,} ({time.perf_counter() - t0:.0f} s)")
    producer.close()
    produce_s = time.perf_counter() - t0
    ends = {p: 0 for p in range(partitions)}
    for p, off in expect:
        ends[p] = max(ends[p], off + 1)
    n_valid = sum(1 for v in expect.values() if v[1])
    say(f"on the topic: {len(expect):,} records ({n_valid:,} valid step events) in "
        f"{produce_s:.0f} s; ends {ends}")

    env = _child_env(topics, args.torch_threads)
    py = sys.executable
    port = free_port()
    worker = Child("screen", [py, "-m", "monitor.cli", "stream", "--role", "screen",
                              "--policy", str(models.policy), "--group", "chaos",
                              "--bootstrap-servers", bootstrap, "--batch-size",
                              str(args.batch_size), "--idle-timeout", str(args.idle_timeout_s),
                              "--metrics-port", str(port)],
                   env, work / "screen.log", clock)
    committed = Committed(settings, "chaos-screen", [topics.steps_deployment], partitions)
    supervisor = Supervisor([worker], clock, restart_clean=False)
    kills: list[dict[str, Any]] = []
    t_run = time.perf_counter()
    worker.start()
    try:
        supervisor.thread.start()
        total = len(expect)
        marks = [total * (k + 1) / (args.fuzz_kills + 1) for k in range(args.fuzz_kills)]
        last_total, last_change = -1, time.monotonic()
        stuck = False
        while True:
            got = committed.read() or {}
            done = sum(got.values())
            if done != last_total:
                if last_total >= 0 and int(done / total * 10) != int(last_total / total * 10):
                    say(f"committed {done:,}/{total:,} ({time.perf_counter() - t_run:.0f} s)")
                last_total, last_change = done, time.monotonic()
            if marks and done >= marks[0]:
                marks.pop(0)
                t_k = clock()
                worker.kill9()
                after = committed.read() or {}
                kills.append({"at_s": round(t_k, 1), "committed_at_kill": {
                    str(p): after.get((topics.steps_deployment, p), 0) for p in range(partitions)}})
                say(f"kill -9 the screen worker at {done:,}/{total:,} committed; starting it again")
                worker.restart()
            if all(got.get((topics.steps_deployment, p), 0) >= ends[p] for p in range(partitions)):
                break
            if time.monotonic() - last_change > args.stall_s:
                stuck = True
                say(f"no commit for {args.stall_s:.0f} s: stuck at {got}")
                break
            time.sleep(0.5)
        consume_s = time.perf_counter() - t_run
        final = committed.read() or {}
        say(f"committed through the end in {consume_s:.0f} s" if not stuck else "stuck")
        stopped_by_itself = wait_until(lambda: not worker.alive, args.idle_timeout_s + 60, 0.5)
        supervisor.stop.set()
        rc = worker.proc.returncode if stopped_by_itself and worker.proc is not None else \
            worker.terminate(60)
    finally:
        supervisor.stop.set()
        if worker.alive:
            worker.kill9()
        committed.close()

    say("reading the dead letters and the scores back")
    reader = Reader(settings, [topics.deadletter, topics.scores], partitions, clock)
    reader.thread.start()
    wait_until(lambda: clock() - reader.last_record > 8.0, 600, 1.0)
    reader.close()
    dead = reader.records(topics.deadletter)
    scores = reader.records(topics.scores)
    return _fuzz_figures(args, expect, ends, final, topics, dead, scores, kills,
                         supervisor, rc, stopped_by_itself, stuck, produce_s, consume_s,
                         refused_by_producer, models, partitions, work)


Expected = dict[tuple[int, int], tuple[str, bool, str, str]]  # (partition, offset) ->
# (category, valid, step key, why not)


def _fuzz_figures(args: argparse.Namespace, expect: Expected,
                  ends: dict[int, int], final: dict[tuple[str, int], int], topics: Any,
                  dead: list[Seen],
                  scores: list[Seen], kills: list[dict[str, Any]], supervisor: Supervisor,
                  rc: int | None, stopped_by_itself: bool, stuck: bool, produce_s: float,
                  consume_s: float, refused: Counter[str], models: Models, partitions: int,
                  work: Path) -> dict[str, Any]:
    per_input: Counter[tuple[int, int]] = Counter()
    kinds: Counter[str] = Counter()
    reasons: Counter[str] = Counter()
    other_dead: Counter[str] = Counter()
    valid_reasons: Counter[str] = Counter()
    for d in dead:
        if d.origin is None:
            other_dead["no origin headers"] += 1
            continue
        topic, partition, offset, reason = d.origin
        if topic != topics.steps_deployment:
            other_dead[reason[:120]] += 1
            continue
        per_input[(partition, offset)] += 1
        kinds[reason.split(":", 1)[0]] += 1
        reasons[_reason_shape(reason)] += 1
        if expect.get((partition, offset), ("", False))[1]:
            valid_reasons[reason[:300]] += 1
    bad = {w for w, v in expect.items() if not v[1]}
    valid = {w for w, v in expect.items() if v[1]}
    not_dead = sorted(bad - set(per_input))
    valid_dead = sorted(valid & set(per_input))
    repeats = {w: n for w, n in per_input.items() if n > 1}

    def windows(w: tuple[int, int]) -> int:  # kills at which this input was not committed yet
        return sum(1 for k in kills if k["committed_at_kill"].get(str(w[0]), 0) <= w[1])

    explained = sum(min(n - 1, windows(w)) for w, n in repeats.items())
    excess = sum(n - 1 for n in repeats.values())
    want_keys = {v[2] for v in expect.values() if v[1]}
    tier0 = Counter(s.key.rsplit("/", 1)[0] for s in scores if s.tier == 0)
    by_cat: dict[str, dict[str, int]] = {}
    for w, (cat, ok, _k, _r) in expect.items():
        c = by_cat.setdefault(cat, {"records": 0, "valid": 0, "dead_lettered": 0})
        c["records"] += 1
        c["valid"] += int(ok)
        c["dead_lettered"] += int(w in per_input)
    stuck_parts = {str(p): {"committed": final.get((topics.steps_deployment, p), 0),
                            "end": ends[p]} for p in range(partitions)}
    n_stuck = sum(1 for v in stuck_parts.values() if v["committed"] < v["end"])
    escaped = Counter(v[3] for v in expect.values() if "escaped" in v[3])
    per_bad_input = {
        "exactly_once": sum(1 for w in bad if per_input.get(w) == 1),
        "more_than_once": len(repeats),
        "excess_dead_letters": excess,
        "excess_explained_by_kill_redelivery": explained,
        "excess_not_explained": excess - explained,
    }
    figures = {
        "records_on_topic": len(expect),
        "records_by_category": by_cat,
        "records_refused_by_the_producer_client": dict(refused),
        "valid_step_events": len(valid),
        "bad_records": len(bad),
        "produce_s": round(produce_s, 1),
        "consume_s": round(consume_s, 1),
        "records_per_s": round(len(expect) / consume_s) if consume_s else None,
        "crashes": len(supervisor.crashes),
        "crash_details": supervisor.crashes,
        "exit_code_at_end": rc,
        "stopped_by_idle_timeout": stopped_by_itself,
        "kills": kills,
        "stuck_offsets": n_stuck,
        "committed_vs_end": stuck_parts,
        "stalled": stuck,
        "dead_letters": len(dead),
        "dead_letters_not_of_an_input": dict(other_dead),
        "dead_letter_kinds": dict(kinds.most_common()),
        "dead_letter_reasons_top": dict(reasons.most_common(25)),
        "bad_inputs_dead_lettered": len(bad & set(per_input)),
        "bad_inputs_never_dead_lettered": len(not_dead),
        "bad_inputs_never_dead_lettered_sample": [
            {"partition": p, "offset": o, "category": expect[(p, o)][0]} for p, o in not_dead[:20]],
        "valid_inputs_dead_lettered": len(valid_dead),
        "valid_inputs_dead_lettered_reasons": dict(valid_reasons.most_common(10)),
        "dead_letters_per_bad_input": per_bad_input,
        "decode_exceptions_other_than_RecordError": dict(escaped),
        "valid_steps_expected": len(want_keys),
        "valid_steps_scored_tier0": len(want_keys & set(tier0)),
        "valid_steps_not_scored": len(want_keys - set(tier0)),
        "tier0_score_repeats": sum(n - 1 for n in tier0.values()),
        "logs": str(work),
    }
    return {
        "measured": "fuzzed records on the deployment steps topic through one screen worker "
                    "killed -9 mid-run: crashes, stuck offsets, dead letters per bad input",
        "data": {"base_step_events_from": str(models.data.relative_to(ROOT)
                                              if models.data.is_relative_to(ROOT)
                                              else models.data),
                 "policy": models.kind,
                 "mix": MIX | {"oversize": "0.02 %", "huge_valid (200-600 KB text)": "0.005 %"}},
        "config": {"records": args.records, "fuzz_kills": args.fuzz_kills,
                   "batch_size": args.batch_size, "idle_timeout_s": args.idle_timeout_s,
                   "stall_s": args.stall_s, "broker": "Tansu, memory storage",
                   "partitions": partitions, "max_record_bytes": 1_048_576,
                   "torch_threads_per_worker": args.torch_threads, "seed": args.seed},
        "figures": figures,
        "targets": {"crashes_0": figures["crashes"] == 0 and rc == 0,
                    "stuck_offsets_0": n_stuck == 0,
                    "every_bad_input_dead_lettered": not not_dead,
                    "no_unexplained_repeat_dead_letters":
                        per_bad_input["excess_not_explained"] == 0,
                    "every_valid_step_scored": figures["valid_steps_not_scored"] == 0},
    }


# --- main ---------------------------------------------------------------------------------


def _reason_shape(reason: str) -> str:
    """A dead letter's reason with its numbers and quoted values blanked, so alike ones
    count together."""
    shape = re.sub(r"'[^']*'|\"[^\"]*\"", "'…'", reason)
    return re.sub(r"\d+", "N", shape)[:140]


def write_part(out: Path, part: str, block: dict[str, Any]) -> None:
    """Put ``block`` under ``part`` in ``out``, keeping the other part's block."""
    data: dict[str, Any] = {}
    if out.exists():
        with contextlib.suppress(ValueError):
            data = json.loads(out.read_text())
    data[part] = block
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=2, allow_nan=False) + "\n")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Chaos bench: kill -9 the pipeline's processes and the broker under "
        "steady traffic (part kill), or feed the screen stage fuzzed records (part fuzz); "
        "writes bench/results/chaos.json.",
        epilog=__doc__.split("\n\n", 2)[1] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--part", choices=["kill", "fuzz"], default="kill",
                   help="which part to run (default kill)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT,
                   help="the JSON to write the part's block into (default %(default)s)")
    p.add_argument("--policy", help="a calibrated policy (default: the tiny build, made under "
                   "bench/.cache/chaos on first use)")
    p.add_argument("--data", help="the AgentDojo build the traffic comes from (default: the "
                   "tiny build's)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch-size", type=int,
                   help="worker --batch-size (default: kill 16, fuzz 128)")
    p.add_argument("--torch-threads", type=int,
                   help="OMP threads per worker process (default: kill 1, as three workers "
                   "share the CPUs; fuzz 2)")
    k = p.add_argument_group("part kill")
    k.add_argument("--kills", type=int, default=20, help="kill -9 this many times (default 20)")
    k.add_argument("--targets", default="screen,review,recall,paging",
                   help="what may be killed, comma-separated (default %(default)s)")
    k.add_argument("--stages", default="screen,review,recall",
                   help="worker stages, one process each (default %(default)s)")
    k.add_argument("--rate", type=float, default=5.0, help="steps per second (default 5)")
    k.add_argument("--outage-s", type=float, default=60.0,
                   help="how long the broker stays away (default 60; 0: no outage)")
    k.add_argument("--burst", type=int, default=40,
                   help="steps sent at once before each kill, on top of --rate, so the kill "
                   "finds the stages busy (default 40; 0: steady traffic only)")
    k.add_argument("--burst-kill-min-s", type=float, default=0.3)
    k.add_argument("--burst-kill-max-s", type=float, default=3.0,
                   help="the kill follows the burst after a random 0.3-3 s")
    k.add_argument("--warmup-s", type=float, default=10.0,
                   help="traffic before the first kill (default 10)")
    k.add_argument("--gap-min-s", type=float, default=1.0)
    k.add_argument("--gap-max-s", type=float, default=5.0,
                   help="random pause after a kill's recovery (default 1-5 s)")
    k.add_argument("--recover-timeout-s", type=float, default=120.0,
                   help="longest wait for a killed process to work again (default 120)")
    k.add_argument("--drain-s", type=float, default=240.0,
                   help="longest wait for the pipeline to drain at the end (default 240)")
    k.add_argument("--paging-store", choices=["postgres", "sqlite"], default="postgres",
                   help="the paging service's database (default postgres; SQLite if "
                   "PostgreSQL cannot be reached)")
    k.add_argument("--postgres-url", default="postgresql://postgres@127.0.0.1:5432/postgres",
                   help="a PostgreSQL database to create the run's own database from")
    k.add_argument("--keep", action="store_true", help="keep the run's PostgreSQL database")
    f = p.add_argument_group("part fuzz")
    f.add_argument("--records", type=int, default=100_000,
                   help="fuzzed records (default 100,000)")
    f.add_argument("--fuzz-kills", type=int, default=3,
                   help="kill -9 the screen worker this many times (default 3)")
    f.add_argument("--idle-timeout-s", type=float, default=15.0,
                   help="the worker's --idle-timeout (default 15)")
    f.add_argument("--stall-s", type=float, default=120.0,
                   help="no commit for this long ends the run as stuck (default 120)")
    args = p.parse_args(argv)
    if args.batch_size is None:
        args.batch_size = 16 if args.part == "kill" else 128
    if args.torch_threads is None:
        args.torch_threads = 1 if args.part == "kill" else 2
    args.targets = [t.strip() for t in args.targets.split(",") if t.strip()]
    args.stages = [s.strip() for s in args.stages.split(",") if s.strip()]
    for s in args.stages:
        if s not in STAGES:
            p.error(f"--stages: {s!r} is not one of {', '.join(STAGES)}")
    for t in args.targets:
        if t != "paging" and t not in args.stages:
            p.error(f"--targets: {t!r} is neither paging nor one of --stages")
    if args.rate <= 0 or args.records < 10:
        p.error("--rate must be positive and --records at least 10")
    return args


def _quiet_dropped_producers(u: Any) -> None:
    """A producer dropped after a failed flush (``Bus.reset``) times out in its ``__del__``
    while the broker is away: expected, so not printed as a traceback."""
    if "KafkaProducer.__del__" in repr(u.object) and "Timeout" in u.exc_type.__name__:
        return
    sys.__unraisablehook__(u)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    sys.unraisablehook = _quiet_dropped_producers
    load = os.getloadavg()
    started = datetime.now(UTC)
    block = run_kill(args) if args.part == "kill" else run_fuzz(args)
    command = "python bench/chaos_bench.py " + " ".join(sys.argv[1:] if argv is None else argv)
    block = {"command": command.strip(), **block, "machine": machine(load),
             "when": started.isoformat(timespec="seconds")}
    write_part(args.out, args.part, block)
    say(f"wrote the {args.part} part to {args.out}")
    print(json.dumps({"figures": {k: v for k, v in block["figures"].items()
                                  if not isinstance(v, list | dict)},
                      "targets": block["targets"]}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
