"""TITO records → execution trees: the reconstruction (DESIGN §2.2, §5).

- **continuation**: call ``c`` continues ``p`` when ``p.input_ids + p.output_ids``
  is a prefix of ``c.input_ids``; the parent is the longest such prefix.
- **compaction**: a call with no prefix parent whose ``input_ids`` contain a
  summary call's ``output_ids`` (same role family) hangs under that summary.
- anything else is a root: the main agent's first call, each sub-agent's first
  call.

Reconstruction is a pure function of the *set* of records: :func:`build_tree` for one
execution, :func:`reconstruct` for many.
"""

from __future__ import annotations

import hashlib
import heapq
from array import array
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from streams.records import ExecutionEnd, RecordError, TitoCall
from streams.tito.tree import (
    ROLE_FAMILY,
    SUMMARY_ROLES,
    Edge,
    ExecutionTree,
    Node,
    Provenance,
    call_conflict,
    end_conflict,
)

_WIDTH = 8  # bytes per token id in the packed form (int64)


def _pack(call: TitoCall, ids: Sequence[int]) -> bytes:
    try:
        return array("q", ids).tobytes()
    except OverflowError:
        raise out_of_range(call) from None


def out_of_range(call: TitoCall) -> RecordError:
    """The error for a call with a token id that the packed (int64) form cannot hold."""
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
                or ROLE_FAMILY[sc.role] != ROLE_FAMILY[r.call.role]
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
            raise call_conflict(c)
    return out



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
            raise end_conflict(e)
    ids = sorted(set(grouped) | set(by_exec))
    return [build_tree(eid, grouped.get(eid, ()), by_exec.get(eid)) for eid in ids]


def provenance(tree: ExecutionTree, call_id: str) -> Provenance:
    """Which of ``call_id``'s input tokens (and text) are new observation, which inherited."""
    return tree.nodes[call_id].provenance
