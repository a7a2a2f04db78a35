"""Execution trees → interchange trajectories: one per root-to-leaf path.

Every root-to-leaf path is one :class:`~streams.records.Trajectory`; shared calls
keep one ``step_id`` (the call id), and :func:`unique_actions` lists each call once
so a screener scores each policy output exactly once. :func:`select_trajectories`
is the trainer-facing choice of at most ``j_max`` of them.
"""

from __future__ import annotations

from typing import Any

from streams.records import (
    Action,
    Observation,
    RecordError,
    Step,
    TitoCall,
    ToolCall,
    Trajectory,
    parse_json,
)
from streams.tito.tree import ROLE_PRIORITY, ExecutionTree, Node


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
    step: dict[str, Any] = {
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
    if c.trainer_logprobs is not None:  # the trainer's recomputation: off-policy drift at L0
        step["trainer_logprobs"] = list(c.trainer_logprobs)
    return Step.model_validate(step)


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
