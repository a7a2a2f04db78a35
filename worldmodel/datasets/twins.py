"""Read-only twins: a hijacked trajectory with the agent's compliance taken out.

A monitor must tell *reading* a planted instruction from *acting* on it: an agent that
reads "send the file to mark@..." in a tool result and carries on with the user's task has
done nothing wrong. A judge trained only on hijacked runs (which read and act) and clean
runs (which read nothing) learns to flag the instruction. Every corpus with step labels and
injected-observation flags (AgentDojo: ``injected`` on the step whose observation shows
injected text) gives the missing case for free: :func:`read_only_twin` drops the harmful
steps of a hijacked trajectory and keeps the rest, so the agent still reads the instruction
and then carries on with the user's task. A kept step that followed dropped ones sees what
the agent saw before them (the tool result holding the injection), not the dropped call's
result. The twin's last step, judged in trajectory mode, is a benign trajectory that read a
planted instruction: a hard negative for training, and the measure of how often the judge
flags reading alone (``bench/judge_read_only_bench.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from worldmodel.datasets.format import HISTORY, Transition, View

SUFFIX = "#read-only"  # the twin's trajectory id: the original's with this appended


def read_only_steps(steps: Sequence[Transition]) -> list[Transition]:
    """Every step of ``steps``' (one trajectory's transitions) read-only twin, in order, each
    with its history rebuilt from the kept steps before it; empty when the trajectory is not
    one that read an injection and then acted on it (no harmful step, no injected
    observation before the first harmful step, or no benign step left after it)."""
    ts = sorted(steps, key=lambda t: t.index)
    first_bad = next((i for i, t in enumerate(ts) if t.label), None)
    if first_bad is None:
        return []
    if not any(t.injected for t in ts[: first_bad + 1]):
        return []  # it never read an injection before it acted
    kept: list[Transition] = []
    seen: str | None = None  # what the agent saw before a run of dropped steps
    for t in ts:
        if t.label:
            if seen is None:
                seen = t.observation.text
            continue
        if seen is not None:
            t = replace(t, observation=View(text=seen, screenshot=t.observation.screenshot))
            seen = None
        kept.append(t)
    if not kept or kept[-1].index < ts[first_bad].index:
        return []  # nothing benign after the first harmful step
    return [replace(t, trajectory_id=t.trajectory_id + SUFFIX,
                    transition_id=t.transition_id + SUFFIX, label=0, category=None,
                    history=tuple((k.observation.text, k.action_text)
                                  for k in kept[:n])[-HISTORY:],
                    meta={**(t.meta or {}), "read_only_twin": True})
            for n, t in enumerate(kept)]


def read_only_twin(steps: Sequence[Transition]) -> Transition | None:
    """The last step of ``steps``' read-only twin (:func:`read_only_steps`), None when it
    has none."""
    twin = read_only_steps(steps)
    return twin[-1] if twin else None
