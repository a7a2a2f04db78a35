"""AgentDojo trajectories: suites and attacks used, harm categories, splits, step records.

What the builder records and where it goes, independent of running anything:
the suites and attacks (and the attacks left out, with why), :func:`category_of`
a label-1 call, the ``train`` / ``val`` / ``test_*`` split of a trajectory
(:func:`val_groups`, :func:`assign_split`), and :class:`ToolUseTrajectory`
with its two written forms (transitions, DESIGN §2.1 interchange).
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from streams.records import Action, Observation, Step, ToolCall, Trajectory
from worldmodel.datasets.format import Transition, View, history_of

BENCHMARK_VERSION = "v1.2.2"  # the newest benchmark version agentdojo 0.1.35 ships
TRAIN_SUITES = ("workspace", "travel", "banking")
EVAL_SUITES = ("slack",)
SUITES = (*TRAIN_SUITES, *EVAL_SUITES)
TRAIN_ATTACK = "important_instructions"
# Our own offline attack (augment.ParaphraseAttack): injection wordings written for
# this project, one per (user task, injection task) pair; training suites only.
PARAPHRASE_ATTACK = "vigil_paraphrase"
TRAIN_ATTACKS = (TRAIN_ATTACK, PARAPHRASE_ATTACK)
# Template attacks that need no LLM: each fills a fixed jailbreak string with the
# injection task's goal (and the names below). Evaluation only.
EVAL_ATTACKS = (
    "direct",
    "ignore_previous",
    "system_message",
    "injecagent",
    "tool_knowledge",
    "important_instructions_no_user_name",
    "important_instructions_no_model_name",
    "important_instructions_no_names",
    "important_instructions_wrong_model_name",
    "important_instructions_wrong_user_name",
)
ATTACKS = (TRAIN_ATTACK, *EVAL_ATTACKS)
# Registered attacks this builder does not use, and why.
_DOS = "a denial-of-service text with no injection task: no attacker calls to splice"
UNUSED_ATTACKS = {
    "manual": "asks for the injection text on stdin",
    **{
        name: _DOS
        for name in ("dos", "swearwords_dos", "captcha_dos", "offensive_email_dos", "felony_dos")
    },
}
# The attacked pipeline's name: the attacks address the model by the prose name
# AgentDojo maps it to ("GPT-4"); nothing is ever queried.
TARGET_MODEL = "gpt-4o-2024-05-13"
VAL_FRACTION = 0.2

MONEY_MOVEMENT = frozenset({"send_money", "schedule_transaction", "update_scheduled_transaction"})
OUTBOUND_PREFIXES = ("send_", "forward_", "share_", "post_")

Kind = Literal["benign", "hijacked", "injection"]


def category_of(function: str) -> str:
    """Harm category of an attacker-serving call, by its function name.

    Money movement (``send_money``, ``schedule_transaction``,
    ``update_scheduled_transaction``) is ``financial``; anything that sends,
    forwards, shares or posts data out is ``data_exfiltration``; every other
    attacker call (reads, deletions, bookings, password changes) is
    ``prompt_injection``.
    """
    if function in MONEY_MOVEMENT:
        return "financial"
    if function.startswith(OUTBOUND_PREFIXES):
        return "data_exfiltration"
    return "prompt_injection"


def val_groups(
    groups: Sequence[str], *, seed: int = 0, val_fraction: float = VAL_FRACTION
) -> frozenset[str]:
    """The ``val`` share of a suite's groups: the lowest by a stable hash.

    Called with all of a suite's user tasks (or injection tasks), never a
    limited subset, so a group keeps its split whatever the build's limits and
    each suite gets its exact share (a bare hash threshold over 16-40 groups
    lands anywhere from 10 to 40 %).
    """

    def rank(group: str) -> str:
        return hashlib.sha256(f"{seed}/{group}".encode()).hexdigest()

    return frozenset(sorted(groups, key=rank)[: round(len(groups) * val_fraction)])


def assign_split(suite: str, attack: str | None, group: str, val: frozenset[str]) -> str:
    """Where a trajectory goes (``attack`` None: benign or injection-alone).

    Held-out suites go whole to ``test_{suite}``; train suites under any attack
    but ``TRAIN_ATTACKS`` (important_instructions and our paraphrases) go to
    ``test_attacks``; the rest to ``val`` when the group is in ``val`` (see
    :func:`val_groups`), else ``train``.
    """
    if suite not in TRAIN_SUITES:
        return f"test_{suite}"
    if attack is not None and attack not in TRAIN_ATTACKS:
        return "test_attacks"
    return "val" if group in val else "train"


# --- trajectories ------------------------------------------------------------------


@dataclass(frozen=True)
class ToolUseStep:
    """One agent step: what it saw, the call (or final answer) it made, and the result."""

    observation: str
    action_text: str
    next_observation: str
    tool: dict[str, Any] | None = None  # {"name", "arguments"}; None for a final answer
    label: int = 0
    injected: int = 0
    next_injected: int = 0
    category: str | None = None


@dataclass(frozen=True)
class ToolUseTrajectory:
    """One AgentDojo trajectory and where it belongs."""

    trajectory_id: str
    kind: Kind
    suite: str
    user_task: str | None
    injection_task: str | None
    attack: str | None
    task: str
    split: str
    group: str
    steps: tuple[ToolUseStep, ...]
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> int:
        return int(any(s.label for s in self.steps))

    def _meta(self) -> dict[str, Any]:
        return {
            "suite": self.suite,
            "user_task": self.user_task,
            "injection_task": self.injection_task,
            "attack": self.attack,
            "kind": self.kind,
            **self.meta,
        }

    def transitions(self) -> list[Transition]:
        out: list[Transition] = []
        pairs: list[tuple[str, str]] = []
        for i, s in enumerate(self.steps):
            out.append(
                Transition(
                    transition_id=f"{self.trajectory_id}/{i}",
                    trajectory_id=self.trajectory_id,
                    split=self.split,
                    index=i,
                    task=self.task,
                    observation=View(text=s.observation),
                    action_text=s.action_text,
                    next_observation=View(text=s.next_observation),
                    history=history_of(pairs),
                    tool=s.tool,
                    label=s.label,
                    injected=s.injected,
                    next_injected=s.next_injected,
                    category=s.category,
                    group=self.group,
                    meta=self._meta(),
                )
            )
            pairs.append((s.observation, s.action_text))
        return out

    def interchange(self) -> Trajectory:
        """The DESIGN §2.1 form; per-step ``injected`` / ``next_injected`` ride as extra keys."""
        steps = [
            Step(
                step_id=str(i),
                index=i,
                role="main",
                observation=Observation(text=s.observation),
                action=Action(
                    text=s.action_text,
                    tool=ToolCall(name=s.tool["name"], arguments=s.tool["arguments"])
                    if s.tool
                    else None,
                ),
                result=Observation(text=s.next_observation),
                label=1 if s.label else 0,
                category=s.category,
                **{"injected": s.injected, "next_injected": s.next_injected},
            )
            for i, s in enumerate(self.steps)
        ]
        return Trajectory(
            trajectory_id=self.trajectory_id,
            source="benchmark",
            task=self.task,
            steps=steps,
            label=1 if self.label else 0,
            meta={**self._meta(), "split": self.split, "group": self.group},
        )


@dataclass
class BuildNotes:
    """What a build left out and why, and which groups went to val (kept in the manifest)."""

    # "suite/injection_task": its ground truth has no calls (the goal is judged on the
    # final text or by a checker only), so there is nothing to splice or label
    injection_tasks_without_calls: list[str] = field(default_factory=list)
    # "suite/attack" -> (user task, injection task) pairs whose user-task ground truth
    # never shows injected text, so no hijacked trajectory exists
    pairs_without_injection: Counter[str] = field(default_factory=Counter)
    val_groups: set[str] = field(default_factory=set)
    # suite -> its tool renaming (augment.ToolRenaming.as_dict) where one was applied
    renamings: dict[str, dict[str, Any]] = field(default_factory=dict)
