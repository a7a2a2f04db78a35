"""An execution rebuilt from its TITO records: :class:`ExecutionTree` of :class:`Node` calls.

Each node is one model call with its parent (a ``continuation`` or ``compaction``
edge), children, depth and :class:`Provenance` (which input tokens are new
observation, which inherited). The four call roles, and which of them are summaries,
are spelled here; :mod:`streams.tito.rebuild` builds the trees.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

from streams.records import ExecutionEnd, Role, TitoCall

Edge = Literal["continuation", "compaction"]

SUMMARY_ROLES: frozenset[str] = frozenset({"main_summary", "sub_summary"})
ROLE_PRIORITY: Mapping[str, int] = MappingProxyType(
    {"main": 0, "main_summary": 1, "sub": 2, "sub_summary": 3}
)
ROLE_FAMILY: Mapping[str, str] = MappingProxyType(
    {"main": "main", "main_summary": "main", "sub": "sub", "sub_summary": "sub"}
)


class TitoConflictError(ValueError):
    """Two records share an identity (call id, or execution end) but differ in content."""


def call_conflict(call: TitoCall) -> TitoConflictError:
    """The error for a call id delivered again with different content."""
    return TitoConflictError(
        f"call_id {call.call_id!r} of execution {call.execution_id!r} was delivered twice "
        "with different content"
    )


def end_conflict(end: ExecutionEnd) -> TitoConflictError:
    """The error for a second, different end record of one execution."""
    return TitoConflictError(f"execution {end.execution_id!r} has two different end records")


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
