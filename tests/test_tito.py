"""TITO records → execution trees → trajectories (streams.tito)."""

from __future__ import annotations

import itertools
import random
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streams.records import ExecutionEnd, RecordError, TitoCall, Trajectory, decode, encode
from streams.tito import (
    ExecutionTree,
    TitoConflictError,
    TreeAssembler,
    build_tree,
    provenance,
    reconstruct,
    select_trajectories,
    trajectories,
    unique_actions,
)

EID = "exec-1"


# --- helpers that read like the harness they imitate -------------------------------


def root(
    call_id: str,
    inp: Sequence[int],
    out: Sequence[int],
    *,
    role: str = "main",
    t: float = 0.0,
    eid: str = EID,
    text: tuple[str, str] | None = None,
    **extra: Any,
) -> TitoCall:
    """A call on fresh input: the agent's first call, or a sub-agent's."""
    return TitoCall(
        execution_id=eid,
        query_id="q-1",
        call_id=call_id,
        role=role,  # type: ignore[arg-type]
        input_ids=list(inp),
        output_ids=list(out),
        output_logprobs=[-0.5] * len(out),
        input_text=text[0] if text else None,
        output_text=text[1] if text else None,
        started_at=t,
        ended_at=t + 0.5,
        **extra,
    )


def cont(
    parent: TitoCall,
    call_id: str,
    delta: Sequence[int],
    out: Sequence[int],
    *,
    role: str | None = None,
    t: float = 0.0,
    text: tuple[str, str] | None = None,
    **extra: Any,
) -> TitoCall:
    """Continue ``parent``: its input and output, then ``delta`` (tool result, harness text)."""
    in_text = None
    if text is not None and parent.input_text is not None:
        in_text = parent.input_text + (parent.output_text or "") + text[0]
    c = root(
        call_id,
        [*parent.input_ids, *parent.output_ids, *delta],
        out,
        role=role or parent.role,
        t=t,
        eid=parent.execution_id,
        **extra,
    )
    return c.model_copy(update={"input_text": in_text, "output_text": text[1] if text else None})


def after_compaction(
    summary: TitoCall,
    call_id: str,
    prefix: Sequence[int],
    suffix: Sequence[int],
    out: Sequence[int],
    *,
    role: str = "main",
    t: float = 0.0,
    text: tuple[str, str] | None = None,
) -> TitoCall:
    """A fresh context: system prompt, the summary's output, then what comes next."""
    return root(
        call_id,
        [*prefix, *summary.output_ids, *suffix],
        out,
        role=role,
        t=t,
        eid=summary.execution_id,
        text=text,
    )


def end(eid: str = EID, reward: float | None = 0.75, timed_out: bool = False) -> ExecutionEnd:
    return ExecutionEnd(
        execution_id=eid, query_id="q-1", reward=reward, timed_out=timed_out, consumed_version=13
    )


SYS, TASK, SUMMARIZE, RETRY = 1, 2, 30, 99


def branching_execution() -> dict[str, TitoCall]:
    """Main agent with two compactions, a failed attempt retried twice, and a sub-agent.

    m1 → m2 → s1 (main_summary) ⇒ m3 → m4a → m4c (retry prompt)
                                      → m4b → m5 → s2 (main_summary) ⇒ m6 → m7
    u1 → u2 → u3 (sub-agent)
    (→ continuation, ⇒ compaction; m4a and m4b are two attempts on one input)
    """
    m1 = root(
        "m1",
        [SYS, TASK],
        [10, 11],
        t=1,
        text=("SYS fix the bug", " read file"),
        tool_calls=[{"name": "read", "arguments": {"path": "a.py"}}],
    )
    m2 = cont(m1, "m2", [20], [12, 13], t=2, text=(" <file>", " spawn helper"))
    s1 = cont(m2, "s1", [SUMMARIZE], [40, 41, 42], role="main_summary", t=3)
    m3 = after_compaction(s1, "m3", [SYS, TASK], [], [14], t=4)
    m4a = cont(m3, "m4a", [21], [15], t=5)
    m4b = cont(m3, "m4b", [21], [16], t=6)
    m4c = cont(m4a, "m4c", [RETRY], [17], t=7)
    m5 = cont(m4b, "m5", [22], [18], t=8)
    s2 = cont(m5, "s2", [SUMMARIZE], [50, 51], role="main_summary", t=9)
    m6 = after_compaction(s2, "m6", [SYS, TASK], [23], [19], t=10)
    m7 = cont(m6, "m7", [24], [25], t=11)
    u1 = root("u1", [5, 6], [60], role="sub", t=2.5)
    u2 = cont(u1, "u2", [61], [62], t=2.6)
    u3 = cont(u2, "u3", [63], [64], t=2.7)
    return {c.call_id: c for c in (m1, m2, s1, m3, m4a, m4b, m4c, m5, s2, m6, m7, u1, u2, u3)}


EXPECTED_PARENTS: dict[str, tuple[str | None, str | None]] = {
    "m1": (None, None),
    "m2": ("m1", "continuation"),
    "s1": ("m2", "continuation"),
    "m3": ("s1", "compaction"),
    "m4a": ("m3", "continuation"),
    "m4b": ("m3", "continuation"),
    "m4c": ("m4a", "continuation"),
    "m5": ("m4b", "continuation"),
    "s2": ("m5", "continuation"),
    "m6": ("s2", "compaction"),
    "m7": ("m6", "continuation"),
    "u1": (None, None),
    "u2": ("u1", "continuation"),
    "u3": ("u2", "continuation"),
}


def links(tree: ExecutionTree) -> dict[str, tuple[str | None, str | None]]:
    return {cid: (n.parent_id, n.edge) for cid, n in tree.nodes.items()}


def step_paths(trajs: Iterable[Trajectory]) -> dict[str, list[str]]:
    return {t.trajectory_id: [s.step_id for s in t.steps] for t in trajs}


# --- the worked example -----------------------------------------------------------


def test_branching_execution_has_the_expected_links_leaves_and_counts() -> None:
    calls = branching_execution()
    (tree,) = reconstruct(calls.values(), [end()])

    assert links(tree) == EXPECTED_PARENTS
    assert tree.roots == ("m1", "u1")  # the main agent's tree and the sub-agent's
    assert set(tree.leaves) == {"m4c", "m7", "u3"}
    assert step_paths(trajectories(tree)) == {
        f"{EID}/m4c": ["m1", "m2", "s1", "m3", "m4a", "m4c"],
        f"{EID}/m7": ["m1", "m2", "s1", "m3", "m4b", "m5", "s2", "m6", "m7"],
        f"{EID}/u3": ["u1", "u2", "u3"],
    }
    assert tree.node_occurrences == 18
    assert tree.unique_nodes == 14
    assert tree.duplicate_nodes == 4  # m1, m2, s1, m3 are shared by both main leaves
    assert tree.nodes["s1"].children == ("m3",)  # a summary starts the new branch
    assert tree.nodes["m3"].children == ("m4a", "m4b")  # two attempts, one parent


def test_observation_spans_never_include_parent_outputs() -> None:
    calls = branching_execution()
    (tree,) = reconstruct(calls.values(), [end()])
    deltas = {
        "m2": [20],
        "s1": [SUMMARIZE],
        "m4a": [21],
        "m4b": [21],
        "m4c": [RETRY],
        "m5": [22],
        "s2": [SUMMARIZE],
        "m7": [24],
        "u2": [61],
        "u3": [63],
    }

    for cid, node in tree.nodes.items():
        c, prov = node.call, provenance(tree, cid)
        start, stop = prov.observation
        observed = c.input_ids[start:stop]
        if node.parent_id is None:
            assert prov.observation == (0, len(c.input_ids)) and prov.parent_output is None
            continue
        p = calls[node.parent_id]
        a, b = prov.parent_output  # type: ignore[misc]
        assert c.input_ids[a:b] == p.output_ids  # the parent's action, located exactly
        if node.edge == "continuation":
            assert observed == deltas[cid]
            assert prov.inherited == (0, len(p.input_ids) + len(p.output_ids))
            assert b <= start  # the observation starts after the parent's action
        else:  # compaction: fresh input carrying the summary
            assert prov.observation == (0, len(c.input_ids))
            assert prov.inherited == (0, 0)


def test_text_provenance_and_trajectory_fields() -> None:
    (tree,) = reconstruct(branching_execution().values(), [end()])
    by_id = {t.trajectory_id: t for t in trajectories(tree)}
    long = by_id[f"{EID}/m7"]

    assert long.source == "rollout"
    assert long.task == "SYS fix the bug"
    first, second = long.steps[0], long.steps[1]
    assert (first.observation.text, first.action.text) == ("SYS fix the bug", " read file")
    assert second.observation.text == " <file>"  # the tool result only, not m1's output
    assert second.action.text == " spawn helper"
    assert first.action.tool is not None and first.action.tool.name == "read"
    assert first.action.tool.arguments == {"path": "a.py"}
    assert long.steps[2].observation.text == ""  # no text recorded: ids still kept
    assert [s.index for s in long.steps] == list(range(9))
    assert [s.role for s in long.steps][2] == "main_summary"
    extra = long.steps[3].model_extra or {}
    assert extra["output_ids"] == [14] and extra["output_logprobs"] == [-0.5]
    assert {"policy_version", "dispatch_version"} <= set(extra)
    assert long.meta == {
        "execution_id": EID,
        "query_id": "q-1",
        "leaf_call_id": "m7",
        "leaf_role": "main",
        "reward": 0.75,
        "timed_out": False,
        "consumed_version": 13,
    }
    # the same policy output shared by two leaves is the same step, screened once
    assert by_id[f"{EID}/m4c"].steps[0] == long.steps[0]
    assert [n.call_id for n in unique_actions(tree)].count("m1") == 1
    # trajectories survive the wire format
    assert decode(encode(long), Trajectory) == long


def test_openai_style_tool_call_with_string_arguments() -> None:
    c = root(
        "a",
        [1],
        [2],
        tool_calls=[
            {"type": "function", "function": {"name": "bash", "arguments": '{"cmd": "ls"}'}},
        ],
    )
    (traj,) = trajectories(build_tree(EID, [c]))
    assert traj.steps[0].action.tool is not None
    assert traj.steps[0].action.tool.name == "bash"
    assert traj.steps[0].action.tool.arguments == {"cmd": "ls"}
    no_name = root("b", [1], [2], tool_calls=[{"arguments": {}}])
    assert trajectories(build_tree(EID, [no_name]))[0].steps[0].action.tool is None


def test_identical_retry_attempts_are_siblings_and_ties_break_on_start_time() -> None:
    first = root("r-b", [1, 2], [3], t=1)
    again = root("r-a", [1, 2], [3], t=2)  # the same input, the same sampled output
    nxt = cont(first, "next", [4], [5], t=3)
    tree = build_tree(EID, [nxt, again, first])
    assert links(tree)["r-a"] == (None, None) and links(tree)["r-b"] == (None, None)
    assert tree.nodes["next"].parent_id == "r-b"  # earlier start wins over smaller call_id


def test_failed_attempt_with_no_output_is_a_sibling_not_a_parent() -> None:
    p = root("p", [1], [2])
    failed = cont(p, "failed", [3], [])
    retry = cont(p, "retry", [3], [4])
    tree = build_tree(EID, [p, failed, retry])
    assert tree.nodes["retry"].parent_id == "p"
    assert tree.nodes["failed"].parent_id == "p"


def test_longest_prefix_wins_and_equal_length_counts() -> None:
    a = root("a", [1], [2])
    b = cont(a, "b", [], [3])  # input is exactly a's input + output
    c = cont(b, "c", [4], [5])
    tree = build_tree(EID, [c, b, a])
    assert links(tree) == {
        "a": (None, None),
        "b": ("a", "continuation"),
        "c": ("b", "continuation"),
    }
    assert tree.nodes["b"].provenance.observation == (2, 2)  # nothing new was observed


def test_sub_agent_is_not_linked_to_a_main_summary_it_quotes() -> None:
    m = root("m", [1], [2], t=1)
    s = cont(m, "s", [SUMMARIZE], [40, 41], role="main_summary", t=2)
    sub = root("sub", [7, 40, 41], [8], role="sub", t=3)
    ss = cont(sub, "ss", [SUMMARIZE], [70], role="sub_summary", t=4)
    sub2 = root("sub2", [7, 70], [9], role="sub", t=5)
    tree = build_tree(EID, [m, s, sub, ss, sub2])
    assert tree.nodes["sub"].parent_id is None
    assert links(tree)["sub2"] == ("ss", "compaction")
    assert tree.nodes["sub2"].provenance.parent_output == (1, 2)


def test_summary_that_started_later_is_not_a_compaction_parent() -> None:
    m = root("m", [1], [2], t=5)
    s = cont(m, "s", [SUMMARIZE], [40], role="main_summary", t=6)
    early = root("early", [1, 40], [3], t=4)  # contains s's output, but started before it
    assert build_tree(EID, [m, s, early]).nodes["early"].parent_id is None


def test_a_summary_quoted_by_its_own_root_does_not_make_a_cycle() -> None:
    r = root("r", [1, 40], [2])  # no timestamps, and r's input happens to hold s's output
    s = cont(r, "s", [SUMMARIZE], [40], role="main_summary")
    tree = build_tree(EID, [s, r])
    assert links(tree) == {"r": (None, None), "s": ("r", "continuation")}


def test_latest_summary_wins_when_an_input_carries_two() -> None:
    m = root("m", [1], [2], t=1)
    s1 = cont(m, "s1", [SUMMARIZE], [40], role="main_summary", t=2)
    r1 = after_compaction(s1, "r1", [1], [], [3], t=3)
    s2 = cont(r1, "s2", [SUMMARIZE], [50], role="main_summary", t=4)
    r2 = root("r2", [1, 40, 50], [5], t=5)
    assert build_tree(EID, [m, s1, r1, s2, r2]).nodes["r2"].parent_id == "s2"


def test_large_inputs_reconstruct_quickly() -> None:
    """A long chain with 100k-token contexts: prefix matching stays linear per call."""
    calls = [root("c000", list(range(1000)), [1_000_000])]
    for i in range(1, 100):
        calls.append(cont(calls[-1], f"c{i:03d}", list(range(999)), [1_000_000 + i]))
    random.Random(0).shuffle(calls)
    t0 = time.perf_counter()
    tree = build_tree(EID, calls)
    elapsed = time.perf_counter() - t0
    assert tree.leaves == ("c099",) and tree.nodes["c099"].depth == 99
    assert elapsed < 5.0


# --- ends, duplicates, late records -------------------------------------------------


def test_execution_end_attaches_reward_and_timeout_to_every_leaf() -> None:
    asm = TreeAssembler()
    for c in branching_execution().values():
        assert asm.add_call(c) == "added"
    assert asm.pending_executions() == [EID] and asm.pop_completed() == []
    assert asm.add_end(end(reward=0.3, timed_out=True)) == "added"
    assert asm.completed() == [EID]
    (tree,) = asm.pop_completed()
    for t in trajectories(tree):
        assert t.meta["reward"] == 0.3 and t.meta["timed_out"] is True
        assert t.meta["consumed_version"] == 13
    assert asm.completed() == [] and asm.pending_executions() == []


def test_tree_without_end_has_no_reward_in_meta() -> None:
    (tree,) = reconstruct(branching_execution().values())
    assert tree.end is None
    assert all("reward" not in t.meta for t in trajectories(tree))


def test_late_calls_are_reported_and_redeliveries_are_not() -> None:
    calls = list(branching_execution().values())
    asm = TreeAssembler()
    for c in calls[:-1]:
        asm.add_call(c)
    asm.add_end(end())
    (tree,) = asm.pop_completed()
    assert calls[-1].call_id not in tree.nodes
    assert asm.add_call(calls[-1]) == "late"  # the caller dead-letters it
    assert asm.add_call(calls[0]) == "duplicate"  # a redelivery of an emitted call
    assert asm.add_end(end()) == "duplicate"
    assert asm.pop_completed() == [] and asm.pending_executions() == []


def test_flush_emits_open_executions_and_their_end_is_then_late() -> None:
    asm = TreeAssembler()
    asm.add_call(root("a", [1], [2], eid="open"))
    asm.add_end(end("empty"))  # an end with no calls is an empty execution
    trees = asm.flush()
    assert [(t.execution_id, t.end is None, len(t.nodes)) for t in trees] == [
        ("empty", False, 0),
        ("open", True, 1),
    ]
    assert asm.add_end(end("open")) == "late"


def test_conflicting_duplicate_call_id_raises_naming_it() -> None:
    c = root("dup-7", [1], [2])
    changed = c.model_copy(update={"output_ids": [3]})
    asm = TreeAssembler()
    asm.add_call(c)
    assert asm.add_call(c) == "duplicate"
    with pytest.raises(TitoConflictError, match="dup-7"):
        asm.add_call(changed)
    with pytest.raises(TitoConflictError, match="dup-7"):
        reconstruct([c, changed])
    asm.add_end(end())
    asm.pop_completed()
    with pytest.raises(TitoConflictError, match="dup-7"):
        asm.add_call(changed)  # also after the execution was emitted
    with pytest.raises(TitoConflictError, match=EID):
        asm.add_end(end(reward=0.0))


def test_token_ids_beyond_int64_are_a_record_error_at_the_edge() -> None:
    asm = TreeAssembler()
    with pytest.raises(RecordError, match="huge"):
        asm.add_call(root("huge", [2**64], [1]))
    assert asm.pending_executions() == []


# --- admission ------------------------------------------------------------------------


def test_select_trajectories_prefers_main_then_longest() -> None:
    calls = branching_execution()
    (tree,) = reconstruct(calls.values(), [end()])
    assert [t.trajectory_id for t in select_trajectories(tree, j_max=2)] == [
        f"{EID}/m7",
        f"{EID}/m4c",
    ]
    assert [t.meta["leaf_role"] for t in select_trajectories(tree)] == ["main", "main", "sub"]
    assert select_trajectories(tree, j_max=0) == []

    # a compaction cut short by a timeout leaves a summary leaf, ranked after main leaves
    cut = cont(calls["m7"], "s3", [SUMMARIZE], [80], role="main_summary", t=12)
    (tree,) = reconstruct([*calls.values(), cut], [end()])
    roles = [t.meta["leaf_role"] for t in select_trajectories(tree, j_max=5)]
    assert roles == ["main", "main_summary", "sub"]


# --- property tests ---------------------------------------------------------------


@dataclass
class Generated:
    """A random execution built so the prefix rule holds by construction."""

    execution_id: str
    calls: list[TitoCall] = field(default_factory=list)
    parents: dict[str, tuple[str | None, str | None]] = field(default_factory=dict)
    deltas: dict[str, list[int]] = field(default_factory=dict)
    end: ExecutionEnd | None = None


@st.composite
def generated_execution(draw: st.DrawFn, eid: str) -> Generated:
    tokens = itertools.count(1000)
    g = Generated(eid)

    def fresh(lo: int, hi: int) -> list[int]:
        return [next(tokens) for _ in range(draw(st.integers(lo, hi)))]

    timed = draw(st.booleans())
    by_id: dict[str, TitoCall] = {}
    kid_deltas: dict[str, list[list[int]]] = {}
    for i in range(draw(st.integers(1, 12))):
        cid = f"c{i:02d}"
        t = float(i) if timed else 0.0
        j = draw(st.integers(-1, i - 1))
        out = fresh(1, 3)
        if j < 0:  # a new root: the main agent, or a sub-agent
            role = draw(st.sampled_from(["main", "sub", "main_summary", "sub_summary"]))
            c = root(cid, fresh(1, 3), out, role=role, t=t, eid=eid)
            g.parents[cid] = (None, None)
            g.deltas[cid] = list(c.input_ids)
        else:
            p = by_id[f"c{j:02d}"]
            family = "main" if p.role.startswith("main") else "sub"
            role = draw(st.sampled_from([family, f"{family}_summary"]))
            if p.role.endswith("summary") and draw(st.booleans()):
                c = after_compaction(p, cid, fresh(0, 2), fresh(0, 2), out, role=role, t=t)
                g.parents[cid] = (p.call_id, "compaction")
                g.deltas[cid] = list(c.input_ids)
            else:
                earlier = kid_deltas.setdefault(p.call_id, [])
                retry = bool(earlier) and draw(st.booleans())
                if retry:  # the same input re-sent
                    delta = draw(st.sampled_from(earlier))
                else:
                    delta = fresh(0, 3)
                    earlier.append(delta)
                c = cont(p, cid, delta, out, role=role, t=t)
                g.parents[cid] = (p.call_id, "continuation")
                g.deltas[cid] = list(delta)
        by_id[cid] = c
        g.calls.append(c)
    if draw(st.booleans()):
        g.end = end(eid, reward=draw(st.floats(0, 1)), timed_out=draw(st.booleans()))
    return g


@st.composite
def generated_executions(draw: st.DrawFn) -> list[Generated]:
    n = draw(st.integers(1, 4))
    return [draw(generated_execution(f"x{k}")) for k in range(n)]


def records(gens: Sequence[Generated]) -> list[TitoCall | ExecutionEnd]:
    out: list[TitoCall | ExecutionEnd] = []
    for g in gens:
        out.extend(g.calls)
        if g.end is not None:
            out.append(g.end)
    return out


def assemble(stream: Iterable[TitoCall | ExecutionEnd]) -> list[ExecutionTree]:
    asm = TreeAssembler()
    for r in stream:
        status = asm.add_call(r) if isinstance(r, TitoCall) else asm.add_end(r)
        assert status in ("added", "duplicate")
    trees = asm.pop_completed() + asm.flush()
    return sorted(trees, key=lambda t: t.execution_id)


def summary(trees: Sequence[ExecutionTree]) -> list[Any]:
    return [
        (
            t,
            [x.model_dump() for x in trajectories(t)],
            (t.node_occurrences, t.unique_nodes, t.duplicate_nodes),
        )
        for t in trees
    ]


FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(generated_executions())
def test_reconstruction_recovers_the_generated_tree(gens: list[Generated]) -> None:
    trees = reconstruct(
        [c for g in gens for c in g.calls], [g.end for g in gens if g.end is not None]
    )
    assert [t.execution_id for t in trees] == [g.execution_id for g in gens]
    for g, tree in zip(gens, trees, strict=True):
        assert links(tree) == g.parents
        for cid, node in tree.nodes.items():
            start, stop = node.provenance.observation
            assert node.call.input_ids[start:stop] == g.deltas[cid]


@FAST
@given(generated_executions(), st.randoms(use_true_random=False), st.data())
def test_reconstruction_is_invariant_to_arrival_order_and_redelivery(
    gens: list[Generated], rnd: random.Random, data: st.DataObject
) -> None:
    reference = summary(
        reconstruct([c for g in gens for c in g.calls], [g.end for g in gens if g.end is not None])
    )
    stream = records(gens)
    redelivered = data.draw(st.lists(st.sampled_from(stream), max_size=len(stream)))
    shuffled = stream + redelivered
    rnd.shuffle(shuffled)
    assert summary(assemble(shuffled)) == reference
    rnd.shuffle(shuffled)
    assert (
        summary(
            reconstruct(
                [r for r in shuffled if isinstance(r, TitoCall)],
                [r for r in shuffled if isinstance(r, ExecutionEnd)],
            )
        )
        == reference
    )


@FAST
@given(generated_executions())
def test_deduplication_screens_every_output_exactly_once(gens: list[Generated]) -> None:
    trees = reconstruct(c for gen in gens for c in gen.calls)
    for g, tree in zip(gens, trees, strict=True):
        all_ids = sorted(c.call_id for c in g.calls)
        screened = [n.call_id for n in unique_actions(tree)]
        assert sorted(screened) == all_ids  # every output once, none twice
        position = {cid: i for i, cid in enumerate(screened)}
        for n in tree.nodes.values():  # parents are screened before children
            assert n.parent_id is None or position[n.parent_id] < position[n.call_id]

        trajs = trajectories(tree)
        on_paths = [s.step_id for t in trajs for s in t.steps]
        assert sorted(set(on_paths)) == all_ids  # every call lies on some leaf's path
        assert tree.node_occurrences == len(on_paths)
        assert tree.unique_nodes == len(all_ids)
        assert tree.duplicate_nodes == len(on_paths) - len(all_ids)
        for t in trajs:  # a path runs from a root down to its leaf
            assert tree.nodes[t.steps[0].step_id].parent_id is None
            assert tree.nodes[t.steps[-1].step_id].is_leaf
            for up, down in itertools.pairwise(t.steps):
                assert tree.nodes[down.step_id].parent_id == up.step_id


@FAST
@given(generated_executions(), st.integers(0, 6))
def test_selection_respects_the_cap_and_role_priority(gens: list[Generated], j_max: int) -> None:
    rank = {"main": 0, "main_summary": 1, "sub": 2, "sub_summary": 3}
    for tree in reconstruct(c for g in gens for c in g.calls):
        everything = trajectories(tree)
        chosen = select_trajectories(tree, j_max=j_max)
        assert len(chosen) == min(j_max, len(everything))
        keys = [(rank[t.meta["leaf_role"]], -len(t.steps), t.trajectory_id) for t in chosen]
        assert keys == sorted(keys)
        chosen_ids = {t.trajectory_id for t in chosen}
        left_out = [t for t in everything if t.trajectory_id not in chosen_ids]
        if chosen and left_out:
            worst = max(keys)
            assert all(
                (rank[t.meta["leaf_role"]], -len(t.steps), t.trajectory_id) > worst
                for t in left_out
            )
