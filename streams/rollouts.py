"""TITO topics → screened-once step events: the streaming side of ``streams.tito``.

Consumes the calls and execution-end topics, assembles each execution's tree,
and once an execution has ended (plus a short grace window for calls that
raced its end record) publishes one ``StepEvent`` per unique policy output to
the rollout steps topic, parents first. A node shared by several leaves is
published once; its event names every leaf trajectory through it. Inputs of
executions still open are never committed, so a crash replays them.

An execution whose end never comes cannot hold commits forever: once no record
of it has come for ``open_timeout_s`` (by the wall clock, or by the producer
times of later records on its partition, which a restarted stage reading a
backlog sees at once), or once ``max_open`` newer executions are open, it is
emitted as it is, its last event marked ``meta.incomplete``.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field

from streams.bus import Bus, Message
from streams.config import Topics
from streams.processor import Output, Positions, StreamProcessor
from streams.records import ExecutionEnd, Record, StepEvent, TitoCall
from streams.tito import ExecutionTree, TitoConflictError, TreeAssembler, trajectories


class LateRecordError(ValueError):
    """A TITO record for an execution that was already emitted (dead-lettered)."""


@dataclass(frozen=True)
class TreeSummary:
    execution_id: str
    calls: int
    leaves: int
    node_occurrences: int
    unique_nodes: int
    reward: float | None
    timed_out: bool
    incomplete: bool = False  # emitted without its end record


def rollout_step_events(tree: ExecutionTree) -> list[StepEvent]:
    """One event per unique call (parents first); the last carries the execution's end."""
    leaves_through: dict[str, list[str]] = {}
    steps = {}
    task: dict[str, str] = {}  # a step's task is its own tree's: sub-agents have their own
    for traj in trajectories(tree):
        for s in traj.steps:
            steps[s.step_id] = s
            task.setdefault(s.step_id, traj.task)
            leaves_through.setdefault(s.step_id, []).append(traj.trajectory_id)
    end_meta: dict[str, object] = {}
    if tree.end is not None:
        end_meta = {
            "reward": tree.end.reward,
            "timed_out": tree.end.timed_out,
            "consumed_version": tree.end.consumed_version,
        }
    else:  # emitted without its end record (timed out, or the end of a replayed file)
        end_meta = {"incomplete": True}
    events = []
    for i, call_id in enumerate(tree.order):
        node = tree.nodes[call_id]
        last = i == len(tree.order) - 1
        events.append(
            StepEvent(
                trajectory_id=tree.execution_id,
                source="rollout",
                task=task[call_id],
                step=steps[call_id],
                final=last,
                meta={
                    "execution_id": tree.execution_id,
                    "query_id": tree.query_id,
                    "parent_step_id": node.parent_id,
                    "edge": node.edge,
                    "leaf_trajectory_ids": leaves_through[call_id],
                    **(end_meta if last else {}),
                },
            )
        )
    return events


@dataclass
class QuietExecutions:
    """Which open executions have gone quiet: no record of theirs for ``timeout_s`` by the
    wall clock, or by the producer times of later records on their partition (a stage
    reading a backlog after a restart sees it at once), plus the least recently active
    beyond ``max_open``. The reassembly and the screen stage close these as incomplete."""

    timeout_s: float = 600.0
    max_open: int = 10_000
    clock: Callable[[], float] = time.monotonic
    # per open execution, least recently active first: (clock, producer ms, partition)
    _last: dict[str, tuple[float, int, tuple[str, int]]] = field(default_factory=dict)
    _stream_ms: dict[tuple[str, int], int] = field(default_factory=dict)  # newest per partition

    def __len__(self) -> int:
        return len(self._last)

    def saw(self, message: Message) -> None:
        """A record went by on ``message``'s partition (its producer time moves the clock)."""
        tp = (message.topic, message.partition)
        self._stream_ms[tp] = max(self._stream_ms.get(tp, 0), message.timestamp_ms)

    def touch(self, key: str, message: Message) -> None:
        """A record of execution ``key`` arrived in ``message``."""
        self.saw(message)
        self._last.pop(key, None)
        self._last[key] = (self.clock(), message.timestamp_ms, (message.topic, message.partition))

    def forget(self, key: str) -> None:
        self._last.pop(key, None)

    def quiet(self, keep: Collection[str] = ()) -> list[str]:
        """The executions to close now, least recently active first (never those in
        ``keep``)."""
        now, limit_ms = self.clock(), self.timeout_s * 1000
        out = [k for k, (seen, ts, tp) in self._last.items() if k not in keep and (
            now - seen >= self.timeout_s
            or (ts > 0 and self._stream_ms.get(tp, 0) - ts >= limit_ms))]
        over = len(self._last) - len(out) - self.max_open
        chosen = set(out)
        for k in self._last:
            if over <= 0:
                break
            if k not in chosen and k not in keep:
                out.append(k)
                over -= 1
        return out


@dataclass
class TreeCollector:
    """Collects TITO records and says which executions are complete.

    ``handle`` takes a record (raising :class:`LateRecordError` for one whose
    execution was already emitted); ``ready`` returns the executions whose
    calls can no longer be on their way; ``hold`` is the first offset per
    partition still only in memory (commits never pass it).

    An execution is ready when its end was seen ``grace_s`` ago *and* the calls
    topic has been read past the end's producer time plus ``grace_s``: while a
    backlog is caught up, the small end records run far ahead of the calls, and
    a wall-clock grace alone would emit executions half-read.
    """

    grace_s: float = 1.0
    open_timeout_s: float = 600.0
    max_open: int = 10_000
    clock: Callable[[], float] = time.monotonic
    assembler: TreeAssembler = field(default_factory=TreeAssembler)
    admissions: Counter[str] = field(default_factory=Counter)
    timed_out: int = 0  # executions emitted without their end
    _first_offset: dict[str, dict[tuple[str, int], int]] = field(default_factory=dict)
    _quiet: QuietExecutions = field(init=False)
    _ended_at: dict[str, tuple[float, int]] = field(default_factory=dict)  # wall, producer ms
    _calls_seen: dict[int, tuple[int, float]] = field(default_factory=dict)  # partition -> ts

    def __post_init__(self) -> None:
        self._quiet = QuietExecutions(self.open_timeout_s, self.max_open, self.clock)

    def handle(self, record: Record, message: Message) -> None:
        if isinstance(record, TitoCall):
            eid, admission = record.execution_id, self.assembler.add_call(record)
            self._calls_seen[message.partition] = (message.timestamp_ms, self.clock())
        elif isinstance(record, ExecutionEnd):
            eid, admission = record.execution_id, self.assembler.add_end(record)
            if admission == "added":
                self._ended_at[eid] = (self.clock(), message.timestamp_ms)
        else:  # pragma: no cover - the processor's models map admits only the two
            raise TypeError(f"unexpected record {record.kind}")
        self.admissions[admission] += 1
        if admission == "late":
            raise LateRecordError(f"execution {eid} was already emitted")
        self._quiet.saw(message)
        if admission == "added":
            tp = (message.topic, message.partition)
            firsts = self._first_offset.setdefault(eid, {})
            firsts[tp] = min(firsts.get(tp, message.offset), message.offset)
            self._quiet.touch(eid, message)

    def _calls_watermark(self, now: float) -> float:
        """The producer time the calls topic has been read up to: the oldest last-read
        timestamp over its partitions still delivering (a partition idle for the grace
        window is caught up and does not hold the watermark back)."""
        live = [ts for ts, seen in self._calls_seen.values() if now - seen < self.grace_s]
        return min(live) if live else float("inf")

    def ready(self) -> list[ExecutionTree]:
        now = self.clock()
        mark = self._calls_watermark(now)
        grace_ms = self.grace_s * 1000
        ready = {
            e
            for e, (seen, ts) in self._ended_at.items()
            if now - seen >= self.grace_s and (ts <= 0 or ts + grace_ms <= mark)  # 0: no time
        }
        trees = self._release(self.assembler.pop_completed(ready)) if ready else []
        stale = self._quiet.quiet(keep=self._ended_at)  # ended ones wait for their grace
        if stale:
            self.timed_out += len(stale)
            trees += self._release(self.assembler.pop_open(stale))
        return trees

    def flush(self) -> list[ExecutionTree]:
        """Everything buffered, ended or not (end of a replayed file)."""
        return self._release(self.assembler.flush())

    def _release(self, trees: list[ExecutionTree]) -> list[ExecutionTree]:
        for tree in trees:
            self._ended_at.pop(tree.execution_id, None)
            self._first_offset.pop(tree.execution_id, None)
            self._quiet.forget(tree.execution_id)
        return trees

    def hold(self) -> Positions:
        held: dict[tuple[str, int], int] = {}
        for firsts in self._first_offset.values():
            for tp, off in firsts.items():
                held[tp] = min(held.get(tp, off), off)
        return held


@dataclass
class RolloutReassembler:
    """The handler, tick and hold of a ``StreamProcessor``: trees → rollout step events."""

    topics: Topics
    grace_s: float = 1.0
    on_tree: Callable[[TreeSummary], None] | None = None
    open_timeout_s: float = 600.0
    max_open: int = 10_000
    collector: TreeCollector = field(init=False)

    def __post_init__(self) -> None:
        self.collector = TreeCollector(grace_s=self.grace_s, open_timeout_s=self.open_timeout_s,
                                       max_open=self.max_open)

    @property
    def admissions(self) -> Counter[str]:
        return self.collector.admissions

    def handle(self, record: Record, message: Message) -> Iterable[Output]:
        self.collector.handle(record, message)
        return ()

    def tick(self) -> list[Output]:
        return self._emit(self.collector.ready())

    def flush(self) -> list[Output]:
        """Emit everything buffered, ended or not (end of a replayed file)."""
        return self._emit(self.collector.flush())

    def hold(self) -> Positions:
        return self.collector.hold()

    def _emit(self, trees: list[ExecutionTree]) -> list[Output]:
        outputs = []
        for tree in trees:
            for event in rollout_step_events(tree):
                outputs.append(
                    Output(
                        self.topics.steps_rollout,
                        event,
                        key=tree.execution_id,
                        idempotency_key=f"{tree.execution_id}/{event.step.step_id}",
                    )
                )
            if self.on_tree:
                self.on_tree(
                    TreeSummary(
                        execution_id=tree.execution_id,
                        calls=tree.unique_nodes,
                        leaves=len(tree.leaves),
                        node_occurrences=tree.node_occurrences,
                        unique_nodes=tree.unique_nodes,
                        reward=tree.end.reward if tree.end else None,
                        timed_out=tree.end.timed_out if tree.end else False,
                        incomplete=tree.end is None,
                    )
                )
        return outputs


def reassembly_processor(
    bus: Bus,
    topics: Topics,
    group_id: str = "vigil-reassembly",
    *,
    grace_s: float = 1.0,
    on_tree: Callable[[TreeSummary], None] | None = None,
    max_record_bytes: int = 8 * 1_048_576,
    open_timeout_s: float = 600.0,
    max_open: int = 10_000,
) -> tuple[StreamProcessor, RolloutReassembler]:
    """A processor that turns the TITO topics into rollout step events.

    TITO calls carry whole contexts, so their size limit is larger by default.
    A conflicting redelivery (:class:`TitoConflictError`) or a late record is
    dead-lettered like any bad record. An execution without its end for
    ``open_timeout_s`` (or beyond ``max_open`` open ones) is emitted incomplete.
    """
    r = RolloutReassembler(topics, grace_s=grace_s, on_tree=on_tree,
                           open_timeout_s=open_timeout_s, max_open=max_open)
    proc = StreamProcessor(
        bus,
        {topics.tito_calls: TitoCall, topics.tito_executions: ExecutionEnd},
        group_id,
        r.handle,
        deadletter_topic=topics.deadletter,
        max_record_bytes=max_record_bytes,
        tick=r.tick,
        hold=r.hold,
        ensure_topics=[topics.steps_rollout],
    )
    return proc, r


__all__ = [
    "LateRecordError",
    "RolloutReassembler",
    "TitoConflictError",
    "TreeCollector",
    "TreeSummary",
    "reassembly_processor",
    "rollout_step_events",
]
