"""Streaming assembly: :class:`TreeAssembler` turns a stream of TITO records into trees.

A rollout proxy emits one :class:`~streams.records.TitoCall` per model call and one
:class:`~streams.records.ExecutionEnd` per execution, out of order, interleaved and
at least once; the assembler collects them and emits an execution
(:func:`streams.tito.rebuild.build_tree`) when its end arrives.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Literal

from streams.records import ExecutionEnd, TitoCall
from streams.tito.rebuild import build_tree, out_of_range
from streams.tito.tree import ExecutionTree, call_conflict, end_conflict

Admission = Literal["added", "duplicate", "late"]

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def _fingerprint(record: TitoCall | ExecutionEnd) -> bytes:
    return hashlib.blake2b(record.model_dump_json().encode(), digest_size=16).digest()


@dataclass
class _OpenExecution:
    calls: dict[str, TitoCall]
    end: ExecutionEnd | None = None


@dataclass(frozen=True)
class _Emitted:
    calls: Mapping[str, bytes]  # call_id -> fingerprint
    end: bytes | None


class TreeAssembler:
    """Collects TITO records from a stream and emits each execution once it has ended.

    Delivery is at least once: a record seen before (same call id, or same end,
    same content) is a ``"duplicate"`` and changes nothing; the same identity
    with different content raises :class:`TitoConflictError`. A record for an
    execution already emitted is ``"late"``: the caller dead-letters it. The
    last ``remember`` emitted executions are remembered as one fingerprint per
    record (about 100 bytes a call); a record for an execution forgotten since
    opens it again.
    """

    def __init__(self, remember: int = 2_000) -> None:
        self.remember = remember
        self._open: dict[str, _OpenExecution] = {}
        self._emitted: OrderedDict[str, _Emitted] = OrderedDict()

    def add_call(self, call: TitoCall) -> Admission:
        """Take one call; raises :class:`RecordError` for token ids no tree can hold."""
        for ids in (call.input_ids, call.output_ids):
            if ids and (min(ids) < _INT64_MIN or max(ids) > _INT64_MAX):
                raise out_of_range(call)
        eid = call.execution_id
        done = self._emitted.get(eid)
        if done is not None:
            fp = done.calls.get(call.call_id)
            if fp is None:
                return "late"
            if fp != _fingerprint(call):
                raise call_conflict(call)
            return "duplicate"
        state = self._open.setdefault(eid, _OpenExecution(calls={}))
        prev = state.calls.get(call.call_id)
        if prev is None:
            state.calls[call.call_id] = call
            return "added"
        if prev != call:
            raise call_conflict(call)
        return "duplicate"

    def add_end(self, end: ExecutionEnd) -> Admission:
        eid = end.execution_id
        done = self._emitted.get(eid)
        if done is not None:
            if done.end is None:
                return "late"
            if done.end != _fingerprint(end):
                raise end_conflict(end)
            return "duplicate"
        state = self._open.setdefault(eid, _OpenExecution(calls={}))
        if state.end is None:
            state.end = end
            return "added"
        if state.end != end:
            raise end_conflict(end)
        return "duplicate"

    def completed(self) -> list[str]:
        """Executions whose end has arrived and that are not emitted yet."""
        return sorted(eid for eid, s in self._open.items() if s.end is not None)

    def pending_executions(self) -> list[str]:
        """Executions still waiting for their end record."""
        return sorted(eid for eid, s in self._open.items() if s.end is None)

    def pop_completed(self, only: Collection[str] | None = None) -> list[ExecutionTree]:
        """Emit every ended execution (sorted by id), or those of them in ``only``;
        later records for them are late."""
        return [self._emit(eid) for eid in self.completed() if only is None or eid in only]

    def pop_open(self, only: Collection[str]) -> list[ExecutionTree]:
        """Emit the executions of ``only`` as they are, ended or not (timed out); later
        records for them are late."""
        return [self._emit(eid) for eid in sorted(self._open) if eid in only]

    def flush(self) -> list[ExecutionTree]:
        """Emit everything, ended or not (end of input)."""
        return [self._emit(eid) for eid in sorted(self._open)]

    def _emit(self, eid: str) -> ExecutionTree:
        state = self._open[eid]
        tree = build_tree(eid, state.calls.values(), state.end)
        del self._open[eid]
        self._emitted[eid] = _Emitted(
            calls={cid: _fingerprint(c) for cid, c in state.calls.items()},
            end=None if state.end is None else _fingerprint(state.end),
        )
        while len(self._emitted) > self.remember:
            self._emitted.popitem(last=False)
        return tree
