"""TITO records → execution trees → interchange trajectories (DESIGN §2.2, §5).

A rollout proxy emits one :class:`~streams.records.TitoCall` per model call and
one :class:`~streams.records.ExecutionEnd` per execution, out of order and
interleaved. This module rebuilds each execution into a forest of calls:

- **continuation**: call ``c`` continues ``p`` when ``p.input_ids + p.output_ids``
  is a prefix of ``c.input_ids``; the parent is the longest such prefix.
- **compaction**: a call with no prefix parent whose ``input_ids`` contain a
  summary call's ``output_ids`` (same role family) hangs under that summary.
- anything else is a root: the main agent's first call, each sub-agent's first
  call.

Every root-to-leaf path is one :class:`~streams.records.Trajectory`; shared
calls keep one ``step_id`` (the call id), and :func:`unique_actions` lists each
call once so a screener scores each policy output exactly once.

Reconstruction is a pure function of the *set* of records; :class:`TreeAssembler`
collects a stream of them and emits an execution when its end arrives.
"""

from __future__ import annotations

import hashlib
import heapq
from array import array
from collections import OrderedDict, defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Literal

from streams.records import (
    Action,
    ExecutionEnd,
    Observation,
    RecordError,
    Role,
    Step,
    TitoCall,
    ToolCall,
    Trajectory,
    parse_json,
)

Edge = Literal["continuation", "compaction"]
Admission = Literal["added", "duplicate", "late"]

SUMMARY_ROLES: frozenset[str] = frozenset({"main_summary", "sub_summary"})
ROLE_PRIORITY: Mapping[str, int] = MappingProxyType(
    {"main": 0, "main_summary": 1, "sub": 2, "sub_summary": 3}
)
_FAMILY: Mapping[str, str] = MappingProxyType(
    {"main": "main", "main_summary": "main", "sub": "sub", "sub_summary": "sub"}
)
_WIDTH = 8  # bytes per token id in the packed form (int64)
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


class TitoConflictError(ValueError):
    """Two records share an identity (call id, or execution end) but differ in content."""


@dataclass(frozen=True)
class Provenance:
    """Which tokens of a call's input are new observation and which are inherited.

    Spans are ``(start, end)`` over ``input_ids``. ``observation`` is what the
    harness added for this call (tool results, harness text, retry prompt; all
    of the input for a root). ``inherited`` is the parent's context
    (``input_ids + output_ids``), empty for a root. ``parent_output`` is where
    the parent's ``output_ids`` (its action) sit in this input: right before the
    observation for a continuation, the carried summary for a compaction root.
    """

    call_id: str
    observation: tuple[int, int]
    inherited: tuple[int, int]
    parent_output: tuple[int, int] | None
    observation_text: str
    action_text: str


@dataclass(frozen=True)
class Node:
    """One call in an execution tree."""

    call: TitoCall
    parent_id: str | None
    edge: Edge | None
    children: tuple[str, ...]
    depth: int
    provenance: Provenance

    @property
    def call_id(self) -> str:
        return self.call.call_id

    @property
    def role(self) -> Role:
        return self.call.role

    @property
    def is_leaf(self) -> bool:
        return not self.children


@dataclass(frozen=True)
class ExecutionTree:
    """One execution rebuilt: its nodes, roots (one per independent tree) and leaves.

    ``order`` lists every call once, parents before children, ties by
    ``(started_at, call_id)``; ``roots`` and ``leaves`` follow it.
    """

    execution_id: str
    query_id: str
    nodes: Mapping[str, Node]
    order: tuple[str, ...]
    roots: tuple[str, ...]
    leaves: tuple[str, ...]
    end: ExecutionEnd | None

    @property
    def finished(self) -> bool:
        return self.end is not None

    @property
    def node_occurrences(self) -> int:
        """Sum over leaves of the root-to-leaf path length (nodes counted per trajectory)."""
        return sum(self.nodes[leaf].depth + 1 for leaf in self.leaves)

    @property
    def unique_nodes(self) -> int:
        """Distinct calls on any path (every call lies on some leaf's path)."""
        return len(self.nodes)

    @property
    def duplicate_nodes(self) -> int:
        """Occurrences saved by shared-prefix de-duplication."""
        return self.node_occurrences - self.unique_nodes

    def path(self, call_id: str) -> tuple[Node, ...]:
        """The nodes from the top of ``call_id``'s tree down to it, compaction edges included."""
        out: list[Node] = []
        cur: str | None = call_id
        while cur is not None:
            node = self.nodes[cur]
            out.append(node)
            cur = node.parent_id
        return tuple(reversed(out))


# --- reconstruction -------------------------------------------------------------


def _pack(call: TitoCall, ids: Sequence[int]) -> bytes:
    try:
        return array("q", ids).tobytes()
    except OverflowError:
        raise _out_of_range(call) from None


def _out_of_range(call: TitoCall) -> RecordError:
    return RecordError(
        TitoCall.kind, f"call {call.call_id!r} has a token id outside int64", field="input_ids"
    )


def _order_key(call: TitoCall) -> tuple[float, str]:
    return (call.started_at, call.call_id)


def _find_aligned(hay: bytes, needle: bytes) -> int:
    """Token index of the first occurrence of ``needle`` in ``hay`` (both packed), or -1."""
    i = hay.find(needle)
    while i != -1:
        if i % _WIDTH == 0:
            return i // _WIDTH
        i = hay.find(needle, i + 1)
    return -1


@dataclass(frozen=True)
class _Packed:
    call: TitoCall
    inp: bytes
    out: bytes

    @property
    def n_in(self) -> int:
        return len(self.call.input_ids)

    @property
    def n_ctx(self) -> int:
        return len(self.call.input_ids) + len(self.call.output_ids)


def _prefix_parents(packed: Sequence[_Packed]) -> dict[str, str]:
    """Longest-prefix continuation parents, by hashing each call's input at candidate lengths.

    Each candidate parent is indexed by the digest of its ``input + output``; a
    call's input is hashed once, incrementally, with a digest taken at every
    distinct parent length, so the cost is linear in the input length.
    """
    index: dict[bytes, list[_Packed]] = defaultdict(list)
    for p in packed:
        if p.n_ctx == 0:
            continue  # an empty context is a prefix of everything and continues nothing
        index[hashlib.blake2b(p.inp + p.out, digest_size=16).digest()].append(p)
    lengths = sorted({p.n_ctx for p in packed if p.n_ctx > 0})

    parents: dict[str, str] = {}
    for c in packed:
        h = hashlib.blake2b(digest_size=16)
        view = memoryview(c.inp)
        pos = 0
        hits: list[list[_Packed]] = []
        for n in lengths:
            if n > c.n_in:
                break
            h.update(view[pos * _WIDTH : n * _WIDTH])
            pos = n
            if found := index.get(h.copy().digest()):
                hits.append(found)
        for found in reversed(hits):  # longest first; verify, since digests only index
            exact = [
                p
                for p in found
                if p is not c
                # the same input with nothing produced is a re-send (sibling), not a parent
                and not (not p.out and p.n_in == c.n_in)
                and c.inp.startswith(p.inp)
                and c.inp.startswith(p.out, len(p.inp))
            ]
            if exact:
                parents[c.call.call_id] = min(exact, key=lambda p: _order_key(p.call)).call.call_id
                break
    return parents


def _compaction_parents(
    packed: Sequence[_Packed], parents: Mapping[str, str]
) -> dict[str, tuple[str, int]]:
    """Link each prefix root to the summary whose output its input carries.

    Only summaries of the root's role family that did not start after it are
    candidates; the latest (by ``started_at``, then ``call_id``) wins, skipping
    any summary inside the root's own tree so the result stays a forest.
    Returns ``root_id -> (summary_id, token offset of the summary in the input)``.
    """
    summaries = sorted(
        (p for p in packed if p.call.role in SUMMARY_ROLES and p.out),
        key=lambda p: _order_key(p.call),
        reverse=True,
    )
    roots = sorted(
        (p for p in packed if p.call.call_id not in parents), key=lambda p: _order_key(p.call)
    )
    up: dict[str, str] = dict(parents)
    links: dict[str, tuple[str, int]] = {}

    def top(call_id: str) -> str:
        while call_id in up:
            call_id = up[call_id]
        return call_id

    for r in roots:
        rid = r.call.call_id
        for s in summaries:
            sc = s.call
            if (
                sc.call_id == rid
                or _FAMILY[sc.role] != _FAMILY[r.call.role]
                or sc.started_at > r.call.started_at
                or len(s.out) > len(r.inp)
            ):
                continue
            at = _find_aligned(r.inp, s.out)
            if at < 0 or top(sc.call_id) == rid:
                continue
            links[rid] = (sc.call_id, at)
            up[rid] = sc.call_id
            break
    return links


def _observation_text(call: TitoCall, parent: TitoCall | None, edge: Edge | None) -> str:
    text = call.input_text or ""
    if parent is None or edge != "continuation" or parent.input_text is None:
        return text
    ctx = parent.input_text + (parent.output_text or "")
    return text[len(ctx) :] if text.startswith(ctx) else text


def _provenance(
    call: TitoCall, parent: TitoCall | None, edge: Edge | None, carried_at: int
) -> Provenance:
    n_in = len(call.input_ids)
    if parent is None or edge is None:
        obs, inherited, parent_out = (0, n_in), (0, 0), None
    elif edge == "continuation":
        p_in, p_ctx = len(parent.input_ids), len(parent.input_ids) + len(parent.output_ids)
        obs, inherited, parent_out = (p_ctx, n_in), (0, p_ctx), (p_in, p_ctx)
    else:  # compaction: a fresh input that carries the summary
        obs, inherited = (0, n_in), (0, 0)
        parent_out = (carried_at, carried_at + len(parent.output_ids))
    return Provenance(
        call_id=call.call_id,
        observation=obs,
        inherited=inherited,
        parent_output=parent_out,
        observation_text=_observation_text(call, parent, edge),
        action_text=call.output_text or "",
    )


def _topological(
    calls: Mapping[str, TitoCall], children: Mapping[str, list[str]], tops: Iterable[str]
) -> list[str]:
    heap = [(_order_key(calls[c]), c) for c in tops]
    heapq.heapify(heap)
    out: list[str] = []
    while heap:
        _, cid = heapq.heappop(heap)
        out.append(cid)
        for ch in children.get(cid, ()):
            heapq.heappush(heap, (_order_key(calls[ch]), ch))
    return out


def _dedupe_calls(calls: Iterable[TitoCall]) -> dict[tuple[str, str], TitoCall]:
    out: dict[tuple[str, str], TitoCall] = {}
    for c in calls:
        key = (c.execution_id, c.call_id)
        prev = out.get(key)
        if prev is None:
            out[key] = c
        elif prev != c:
            raise _call_conflict(c)
    return out


def _call_conflict(call: TitoCall) -> TitoConflictError:
    return TitoConflictError(
        f"call_id {call.call_id!r} of execution {call.execution_id!r} was delivered twice "
        "with different content"
    )


def _end_conflict(end: ExecutionEnd) -> TitoConflictError:
    return TitoConflictError(f"execution {end.execution_id!r} has two different end records")


def build_tree(
    execution_id: str, calls: Iterable[TitoCall], end: ExecutionEnd | None = None
) -> ExecutionTree:
    """Rebuild one execution from its calls (any order; identical duplicates are ignored)."""
    unique = _dedupe_calls(calls)
    by_id: dict[str, TitoCall] = {}
    for (eid, cid), c in unique.items():
        if eid != execution_id:
            raise ValueError(f"call {cid!r} belongs to execution {eid!r}, not {execution_id!r}")
        by_id[cid] = c
    if end is not None and end.execution_id != execution_id:
        raise ValueError(f"end record of {end.execution_id!r} given for {execution_id!r}")

    packed = [
        _Packed(c, _pack(c, c.input_ids), _pack(c, c.output_ids))
        for c in sorted(by_id.values(), key=_order_key)
    ]
    cont = _prefix_parents(packed)
    comp = _compaction_parents(packed, cont)
    parent: dict[str, tuple[str, Edge, int]] = {}
    for cid, pid in cont.items():
        parent[cid] = (pid, "continuation", 0)
    for cid, (sid, at) in comp.items():
        parent[cid] = (sid, "compaction", at)

    children: dict[str, list[str]] = defaultdict(list)
    for cid, (pid, _, _) in parent.items():
        children[pid].append(cid)
    for kids in children.values():
        kids.sort(key=lambda k: _order_key(by_id[k]))
    tops = [cid for cid in by_id if cid not in parent]
    order = _topological(by_id, children, tops)

    nodes: dict[str, Node] = {}
    for cid in order:  # parents come first, so their depth is known
        call = by_id[cid]
        link = parent.get(cid)
        pcall = by_id[link[0]] if link else None
        edge: Edge | None = link[1] if link else None
        nodes[cid] = Node(
            call=call,
            parent_id=link[0] if link else None,
            edge=edge,
            children=tuple(children.get(cid, ())),
            depth=nodes[link[0]].depth + 1 if link else 0,
            provenance=_provenance(call, pcall, edge, link[2] if link else 0),
        )

    query_ids = sorted({c.query_id for c in by_id.values() if c.query_id})
    query_id = end.query_id if end is not None and end.query_id else (query_ids or [""])[0]
    return ExecutionTree(
        execution_id=execution_id,
        query_id=query_id,
        nodes=MappingProxyType(nodes),
        order=tuple(order),
        roots=tuple(c for c in order if c not in parent),
        leaves=tuple(c for c in order if not children.get(c)),
        end=end,
    )


def reconstruct(
    calls: Iterable[TitoCall], ends: Iterable[ExecutionEnd] = ()
) -> list[ExecutionTree]:
    """Rebuild every execution in a set of records, sorted by execution id.

    An execution with an end but no calls yields an empty tree; one without an
    end yields a tree whose ``end`` is ``None``.
    """
    grouped: dict[str, list[TitoCall]] = defaultdict(list)
    for (eid, _), c in _dedupe_calls(calls).items():
        grouped[eid].append(c)
    by_exec: dict[str, ExecutionEnd] = {}
    for e in ends:
        prev = by_exec.setdefault(e.execution_id, e)
        if prev != e:
            raise _end_conflict(e)
    ids = sorted(set(grouped) | set(by_exec))
    return [build_tree(eid, grouped.get(eid, ()), by_exec.get(eid)) for eid in ids]


def provenance(tree: ExecutionTree, call_id: str) -> Provenance:
    """Which of ``call_id``'s input tokens (and text) are new observation, which inherited."""
    return tree.nodes[call_id].provenance


# --- trajectories ------------------------------------------------------------------


def unique_actions(tree: ExecutionTree) -> tuple[Node, ...]:
    """Every call once, parents first (ties by ``(started_at, call_id)``): what to screen."""
    return tuple(tree.nodes[c] for c in tree.order)


def _tool(call: TitoCall) -> ToolCall | None:
    if not call.tool_calls:
        return None
    first = call.tool_calls[0]
    if "name" not in first and isinstance(first.get("function"), dict):
        first = first["function"]  # OpenAI shape: {"type": "function", "function": {...}}
    name = first.get("name")
    if not isinstance(name, str) or not name:
        return None
    args = first.get("arguments", {})
    if isinstance(args, str):
        try:  # bounded like any payload: a too-deep or odd string is kept as text
            args = parse_json(args, "tool call arguments") if args.strip() else {}
        except RecordError:
            args = {"raw": args}
    if not isinstance(args, dict):
        args = {"value": args}
    return ToolCall(name=name, arguments=args)


def _step(node: Node) -> Step:
    c = node.call
    return Step.model_validate(
        {
            "step_id": c.call_id,
            "index": node.depth,
            "role": c.role,
            "observation": Observation(text=node.provenance.observation_text),
            "action": Action(text=c.output_text or "", tool=_tool(c)),
            # extra keys of the interchange format: the exact tokens, for RL signals
            "output_ids": list(c.output_ids),
            "output_logprobs": None if c.output_logprobs is None else list(c.output_logprobs),
            "policy_version": c.policy_version,
            "dispatch_version": c.dispatch_version,
        }
    )


def _meta(tree: ExecutionTree, leaf: Node) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "execution_id": tree.execution_id,
        "query_id": tree.query_id,
        "leaf_call_id": leaf.call_id,
        "leaf_role": leaf.role,
    }
    if tree.end is not None:
        meta.update(
            reward=tree.end.reward,
            timed_out=tree.end.timed_out,
            consumed_version=tree.end.consumed_version,
        )
    return meta


def trajectories(tree: ExecutionTree) -> list[Trajectory]:
    """One trajectory per leaf (root-to-leaf path), in ``tree.leaves`` order."""
    steps: dict[str, Step] = {}
    out: list[Trajectory] = []
    for leaf_id in tree.leaves:
        path = tree.path(leaf_id)
        for n in path:
            if n.call_id not in steps:
                steps[n.call_id] = _step(n)
        out.append(
            Trajectory(
                trajectory_id=f"{tree.execution_id}/{leaf_id}",
                source="rollout",
                task=path[0].call.input_text or "",
                steps=[steps[n.call_id] for n in path],
                meta=_meta(tree, path[-1]),
            )
        )
    return out


def select_trajectories(tree: ExecutionTree, j_max: int = 5) -> list[Trajectory]:
    """Admit at most ``j_max`` trajectories by leaf role (main > main_summary > sub >
    sub_summary), then longest path, then ``trajectory_id``."""
    if j_max < 0:
        raise ValueError(f"j_max must be >= 0, got {j_max}")
    ranked = sorted(
        trajectories(tree),
        key=lambda t: (ROLE_PRIORITY[t.meta["leaf_role"]], -len(t.steps), t.trajectory_id),
    )
    return ranked[:j_max]


# --- streaming assembly ------------------------------------------------------------


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
                raise _out_of_range(call)
        eid = call.execution_id
        done = self._emitted.get(eid)
        if done is not None:
            fp = done.calls.get(call.call_id)
            if fp is None:
                return "late"
            if fp != _fingerprint(call):
                raise _call_conflict(call)
            return "duplicate"
        state = self._open.setdefault(eid, _OpenExecution(calls={}))
        prev = state.calls.get(call.call_id)
        if prev is None:
            state.calls[call.call_id] = call
            return "added"
        if prev != call:
            raise _call_conflict(call)
        return "duplicate"

    def add_end(self, end: ExecutionEnd) -> Admission:
        eid = end.execution_id
        done = self._emitted.get(eid)
        if done is not None:
            if done.end is None:
                return "late"
            if done.end != _fingerprint(end):
                raise _end_conflict(end)
            return "duplicate"
        state = self._open.setdefault(eid, _OpenExecution(calls={}))
        if state.end is None:
            state.end = end
            return "added"
        if state.end != end:
            raise _end_conflict(end)
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
