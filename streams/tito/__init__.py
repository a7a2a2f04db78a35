"""TITO records → execution trees → interchange trajectories (DESIGN §2.2, §5).

A rollout proxy emits one :class:`~streams.records.TitoCall` per model call and
one :class:`~streams.records.ExecutionEnd` per execution, out of order and
interleaved. This package rebuilds each execution into a forest of calls
(:func:`build_tree`, :func:`reconstruct`: a pure function of the *set* of records),
turns every root-to-leaf path into one :class:`~streams.records.Trajectory`
(:func:`trajectories`; :func:`unique_actions` lists each call once so a screener
scores each policy output exactly once), and :class:`TreeAssembler` collects a
stream of records and emits an execution when its end arrives.

This module is the package's public API; the modules behind it are::

    tree.py          ExecutionTree, Node, Provenance, the call roles, TitoConflictError
    rebuild.py       records -> trees: continuation and compaction edges
    interchange.py   trees -> trajectories, and the trainer-facing selection
    assembly.py      TreeAssembler: a stream of records -> trees, at least once
"""

from __future__ import annotations

from streams.tito.assembly import Admission, TreeAssembler
from streams.tito.interchange import select_trajectories, trajectories, unique_actions
from streams.tito.rebuild import build_tree, provenance, reconstruct
from streams.tito.tree import (
    ROLE_PRIORITY,
    SUMMARY_ROLES,
    Edge,
    ExecutionTree,
    Node,
    Provenance,
    TitoConflictError,
)

__all__ = [
    "ROLE_PRIORITY",
    "SUMMARY_ROLES",
    "Admission",
    "Edge",
    "ExecutionTree",
    "Node",
    "Provenance",
    "TitoConflictError",
    "TreeAssembler",
    "build_tree",
    "provenance",
    "reconstruct",
    "select_trajectories",
    "trajectories",
    "unique_actions",
]
