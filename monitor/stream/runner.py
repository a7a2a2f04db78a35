"""Running the stages: one thread and one bus per stage, a broker watch, health, SIGTERM.

:class:`Worker` runs the stage processors that :func:`monitor.stream.build.build_worker`
wired, each in its own thread with its own bus (a bus's flush covers what its own stage
published). ``stop`` ends every stage gracefully: it finishes its batch, flushes, commits
and leaves its group; :func:`stop_on_signals` sets it on SIGTERM or SIGINT. With an idle
timeout a stage ends once it and every stage upstream of it are idle.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from monitor.stream.stats import Report, WorkerStats, stderr
from streams.bus import Bus
from streams.config import Topics
from streams.processor import ProcessorStats, StreamProcessor

if TYPE_CHECKING:
    from dashboards.metrics import WorkerMetrics
    from monitor.stream.recall import RecallStage
    from streams.health import BrokerState

ROLES = ("screen", "probe", "review", "reassemble", "recall")
UPSTREAM: Mapping[str, tuple[str, ...]] = {
    "reassemble": (), "screen": ("reassemble",), "probe": ("reassemble", "screen"),
    "review": ("reassemble", "screen", "probe"),
    "recall": ("reassemble", "screen", "probe", "review"),
}
StageFactory = Callable[[Bus], StreamProcessor]


@dataclass(frozen=True)
class WorkerConfig:
    """What to run and where (``monitor stream`` builds one from its flags)."""

    topics: Topics = field(default_factory=Topics)
    roles: tuple[str, ...] = ROLES
    group: str = "vigil"  # consumer groups: {group}-screen, {group}-probe, ... -reassembly
    batch_size: int = 64
    idle_timeout_s: float | None = None  # stop a stage after this long without input
    stats_every_s: float = 5.0
    grace_s: float = 1.0  # TITO: wait this long after an execution's end for late calls
    recall_max_steps: int = 200_000  # the recall stage remembers this many steps' tiers
    execution_timeout_s: float = 600.0  # a rollout execution silent this long is closed
    max_open_executions: int = 10_000  # ... and the oldest beyond this many open
    watch_interval_s: float = 1.0  # ask the broker this often whether it is there
    adapt_window: int | None = None  # live gate thresholds over this many scores (--adapt)

    def group_of(self, role: str) -> str:
        return f"{self.group}-{'reassembly' if role == 'reassemble' else role}"


def stop_on_signals(stop: threading.Event, report: Report = stderr) -> None:
    """SIGINT and SIGTERM set ``stop``: every stage finishes its batch, then stops."""

    def on_signal(signum: int, _frame: Any) -> None:
        report(f"vigil stream: {signal.Signals(signum).name}: finishing the batch, then stopping")
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)


class Worker:
    """The stages of ``config.roles``, each in its own thread with its own bus."""

    def __init__(
        self,
        config: WorkerConfig,
        bus_factory: Callable[[], Bus],
        stages: Mapping[str, StageFactory],
        *,
        stats: WorkerStats | None = None,
        stop: threading.Event | None = None,
        report: Report = stderr,
        metrics: WorkerMetrics | None = None,
        recall: RecallStage | None = None,
    ) -> None:
        self.config = config
        self.bus_factory = bus_factory
        self.stop = stop or threading.Event()
        self.report = report
        self.stats = stats or WorkerStats()
        self.metrics = metrics
        self.recall = recall
        self.errors: list[tuple[str, BaseException]] = []
        self.broker: BrokerState | None = None  # what the broker watch last said
        self._stages = dict(stages)
        self._delivering: dict[str, str] = {}  # stage -> why its outputs wait (while they do)
        self._done: dict[str, threading.Event] = {r: threading.Event() for r in config.roles}
        self._dead_seen: dict[str, dict[str, int]] = {}
        self._procs: dict[str, StreamProcessor] = {}  # running stages, told of broker outages

    def run(self) -> int:
        """Run every stage until stopped (or idle); 0 if all ended cleanly, 1 otherwise."""
        bus = self.bus_factory()
        try:
            bus.ensure_topics(self.config.topics.all())
        finally:
            bus.close()
        from streams.health import BrokerWatch

        watch_bus = self.bus_factory()
        watch_stop = threading.Event()
        watch = BrokerWatch(watch_bus, self.config.topics.all(),
                            interval_s=self.config.watch_interval_s, on_change=self._on_broker)
        self.broker = watch.state
        watcher = watch.start(watch_stop)
        threads = [
            threading.Thread(target=self._run_stage, args=(role,), name=f"vigil-{role}",
                             daemon=True)
            for role in self.config.roles
        ]
        for t in threads:
            t.start()
        self.report(
            "vigil stream: running " + ", ".join(
                f"{r} (group {self.config.group_of(r)})" for r in self.config.roles)
        )
        try:
            for t in threads:
                while t.is_alive():
                    t.join(0.5)
        finally:
            watch_stop.set()
            watcher.join(10)
            try:
                watch_bus.close()
            except Exception as e:  # noqa: BLE001 - only the watch used it
                self.report(f"vigil stream: closing the broker watch's bus failed: {e}")
        self.report(self.stats.line())
        return 1 if self.errors else 0

    def health(self) -> tuple[bool, dict[str, Any]]:
        """Whether the worker can do its work now, and why not (``/healthz``)."""
        problems: list[str] = []
        b = self.broker
        if b is not None and not b.up:
            problems.append(f"broker down for {time.monotonic() - b.since:.0f} s: {b.reason}")
        problems.extend(f"{role}: {why}" for role, why in list(self._delivering.items()))
        problems.extend(f"{role} stage failed: {type(e).__name__}: {e}"
                        for role, e in list(self.errors))
        stages = {r: ("stopped" if self._done[r].is_set() else "running") for r in self._done}
        return not problems, {"problems": problems, "stages": stages,
                              "broker": "unknown" if b is None else ("up" if b.up else "down")}

    def _upstream_done(self, role: str) -> bool:
        return all(self._done[r].is_set() for r in UPSTREAM[role] if r in self._done)

    def _run_stage(self, role: str) -> None:
        bus = self.bus_factory()
        last_line = 0.0
        try:
            proc = self._stages[role](bus)
            self._procs[role] = proc

            def on_batch(s: ProcessorStats) -> None:
                nonlocal last_line
                self.stats.sync(role, s)
                if self.metrics is not None:
                    self._observe_batch(role, proc)
                if time.monotonic() - last_line >= self.config.stats_every_s:
                    last_line = time.monotonic()
                    self.report(self.stats.line())

            proc.on_batch = on_batch
            if self.metrics is not None:
                m = self.metrics
                proc.on_lag = lambda lags: m.observe_lag(role, lags)
            proc.on_assigned = lambda: self.report(
                f"vigil stream: {role} stage joined group {proc.group_id}")
            proc.on_health = lambda ok, why: self._on_delivery(role, ok, why)
            while not self.stop.is_set():
                proc.run(stop=self.stop, idle_timeout_s=self.config.idle_timeout_s)
                self.stats.sync(role, proc.stats)
                if self.config.idle_timeout_s is None or self._upstream_done(role):
                    break
        except BaseException as e:
            self.errors.append((role, e))
            self.report(f"vigil stream: the {role} stage failed: {type(e).__name__}: {e}")
            self.stop.set()
        finally:
            self._done[role].set()
            try:
                bus.close()
            except Exception as e:  # the stage already failed or finished; say so, do not mask
                self.report(f"vigil stream: closing the {role} stage's bus failed: {e}")

    def _on_delivery(self, role: str, ok: bool, why: str) -> None:
        if ok:
            self._delivering.pop(role, None)
            self.report(f"vigil stream: the {role} stage's outputs are acknowledged again")
        else:
            self._delivering[role] = why
            self.report(f"vigil stream: the {role} stage waits for the broker: {why}")
        if self.metrics is not None:
            self.metrics.delivering.labels(stage=role).set(1 if ok else 0)
            if not ok:
                self.metrics.delivery_failures.labels(stage=role).inc()

    def _on_broker(self, state: BrokerState) -> None:
        self.broker = state
        for proc in list(self._procs.values()):  # positions may not hold on the broker that
            if state.up:  # comes back: each stage joins its group again once it answers
                proc.broker_back()
            else:
                proc.broker_lost()
        if state.up:
            self.report(f"vigil stream: the broker is back ({state.reason}); the stages resume")
        else:
            self.report(f"vigil stream: ALERT the broker does not answer ({state.reason}); "
                        "outputs wait and nothing is committed until it is back")
        if self.metrics is not None:
            self.metrics.broker_up.set(1 if state.up else 0)
            if not state.up:
                self.metrics.broker_outages.inc()

    def _observe_batch(self, role: str, proc: StreamProcessor) -> None:
        """Dead letters since the last batch, and each input's produce-to-published time."""
        m = self.metrics
        assert m is not None
        seen = self._dead_seen.setdefault(role, {})
        for reason, n in list(proc.stats.reasons.items()):
            if n > seen.get(reason, 0):
                m.deadletters.labels(stage=role, reason=reason).inc(n - seen.get(reason, 0))
                seen[reason] = n
        now_ms = time.time() * 1000
        hist = m.step_latency.labels(stage=role)
        for msg in proc.last_batch:
            if msg.timestamp_ms > 0:
                hist.observe(max(0.0, now_ms - msg.timestamp_ms) / 1000)
