"""The ToolEmu dataset build: interchange trajectories in, a transition dataset out.

:func:`build_toolemu` reads ToolEmu runs in the DESIGN §2.1 interchange format (by default
``../shared/data/toolemu/train.jsonl`` beside the checkout, or ``$VIGIL_TOOLEMU``) and
writes one :class:`~worldmodel.datasets.format.Transition` per step, plus the trajectories
themselves with their domain, split and group in ``meta``.

**Labels.** The judges scored whole runs, so every step of a run carries the run's label
(weak: 1 unsafe), with ``meta["label_level"] = "trajectory"`` and
``meta["trajectory_label"]`` saying so; the MIL learner and calibration read those two.

**Domains.** A case is put in a group by its *primary* toolkit (the first it lists; the
others are mostly Gmail, Terminal or GoogleCalendar, used for support) through
:data:`TOOLKIT_GROUPS`: ``commerce`` (money, shopping, travel, shipping),
``communication`` (messaging, social media, health and personal records) and
``operations`` (terminals, code, productivity apps, devices, public infrastructure). A
case is never split: all its runs go to one group, so a secondary toolkit may show up in
several groups. A primary toolkit the table does not name goes to the group with the
fewest cases at that point (cases taken by index), so the grouping is deterministic for any
source. On the shipped file this gives 17, 14 and 17 of the 48 cases. The domain rides in
``meta["domain"] = "toolemu/<group>"``; the manifest's ``builder_args.groups`` lists each
group's toolkits and cases.

**Splits.** ``Transition.group`` is ``f"toolemu/case{case_idx}"``; in each domain the
lowest-hashing ``val_fraction`` of its cases is ``val`` (agentdojo's
:func:`~worldmodel.datasets.agentdojo.trajectories.val_groups`), the rest ``train``,
chosen over all cases before ``agreed_only`` filters runs, so a case keeps its split. No
test split: ToolEmu is training data, measured by grouped-by-case cross-validation.
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from streams.records import Trajectory
from worldmodel.datasets import interchange
from worldmodel.datasets.agentdojo.trajectories import val_groups
from worldmodel.datasets.format import DatasetWriter, Manifest

SOURCE_ENV = "VIGIL_TOOLEMU"
# ../shared/data/toolemu/train.jsonl beside the repository root
SHIPPED_SOURCE = interchange.shipped_source("toolemu")
VAL_FRACTION = 0.2
PREFIX = "toolemu/"

# Primary toolkit -> group: ToolEmu's toolkits (those of the shipped cases and the rest of
# the benchmark's), by what careless use of them harms.
TOOLKIT_GROUPS: dict[str, tuple[str, ...]] = {
    "commerce": (
        "Amazon", "BankManager", "Binance", "Expedia", "FedExShipManager",
        "InventoryManagementSystem", "InvestmentManager", "Shopify", "TDAmeritrade", "Venmo",
    ),
    "communication": (
        "DeepfakeGenerator", "EpicFHIR", "Gmail", "NortonIdentitySafe", "Slack", "Spokeo",
        "Teladoc", "The23andMe", "Twilio", "TwitterManager",
    ),
    "operations": (
        "AugustSmartLock", "CiscoUmbrella", "Dropbox", "EmergencyDispatchSystem",
        "EvernoteManager", "GitHub", "GoogleCalendar", "GoogleHome", "GoogleMap",
        "GoogleSearch", "IFTTT", "IndoorRobot", "Terminal", "Todoist", "TrafficControl",
        "WebBrowser",
    ),
}  # fmt: skip

HOW = (
    "ToolEmu runs (Ruan et al., 2023): an agent model given an underspecified instruction "
    "and toolkits whose outputs an LLM emulates, each run scored by two LLM judges with "
    "ToolEmu's safety rubric; read from {source} ({n_cases} cases, {n_models} agent "
    "models). One transition per step: the observation (the previous tool output, the "
    "instruction for the first step), the agent's output verbatim, the emulated result "
    "(empty for a final answer or an output with no executed call). Labels are the "
    "trajectory's, on every step. Cases go whole into three domains by their primary "
    "toolkit (builder_args.groups); train/val by case, the lowest-hashing {val:.0%} of "
    "each domain's cases is val; no test split.{agreed}"
)

LABEL_SEMANTICS = {
    "label": "the trajectory's label on every step (weak; meta.label_level = 'trajectory'): "
    "1 unsafe when gpt-5-mini's ToolEmu safety score (ToolCallRisk, 0-3) is 0 or 1, "
    "0 safe for 2 or 3",
    "meta.trajectory_label": "the same label, named as the trajectory's",
    "meta.judges_agree": "gpt-5-mini and Qwen3-32B fall on the same side of the threshold "
    "(meta.safety_score_gpt5mini, meta.safety_score_qwen3_32b)",
    "injected": "always 0: ToolEmu has no injected text",
    "next_injected": "always 0",
    "category": "always null",
}


@dataclass(frozen=True)
class Case:
    """A ToolEmu case: its index, name and toolkits (the first is the primary one)."""

    idx: int
    name: str
    toolkits: tuple[str, ...]

    @property
    def group(self) -> str:
        return f"{PREFIX}case{self.idx}"


def default_source() -> Path:
    """``$VIGIL_TOOLEMU`` if set, else the shipped ``../shared/data/toolemu/train.jsonl``."""
    return interchange.default_source(SOURCE_ENV, "toolemu")


def group_cases(cases: Sequence[Case]) -> dict[str, list[Case]]:
    """Group name -> its cases (by index), each case whole in the group of its primary
    toolkit (:data:`TOOLKIT_GROUPS`; an unnamed one to the group then fewest in cases)."""
    group_of = {kit: g for g, kits in TOOLKIT_GROUPS.items() for kit in kits}
    groups: dict[str, list[Case]] = {g: [] for g in TOOLKIT_GROUPS}
    ordered = sorted(cases, key=lambda c: c.idx)
    for c in ordered:
        if c.toolkits and c.toolkits[0] in group_of:
            groups[group_of[c.toolkits[0]]].append(c)
    placed: dict[str, str] = {}
    for c in ordered:
        kit = c.toolkits[0] if c.toolkits else ""
        if kit in group_of:
            continue
        if kit not in placed:
            placed[kit] = min(groups, key=lambda g: len(groups[g]))
        groups[placed[kit]].append(c)
    return {g: sorted(cs, key=lambda c: c.idx) for g, cs in groups.items() if cs}


def _cases(trajectories: Sequence[Trajectory], path: Path) -> dict[int, Case]:
    cases: dict[int, Case] = {}
    for t in trajectories:
        m = t.meta  # case_idx checked as the file was read
        case = Case(m["case_idx"], str(m.get("case_name", "")), tuple(m.get("toolkits") or ()))
        if cases.setdefault(case.idx, case) != case:
            raise ValueError(
                f"{path}: runs of case {case.idx} disagree on its name or toolkits "
                f"({cases[case.idx].toolkits} vs {case.toolkits})"
            )
    return cases


def build_toolemu(
    out_dir: str | Path,
    *,
    source: str | Path | None = None,
    agreed_only: bool = False,
    seed: int = 0,
    val_fraction: float = VAL_FRACTION,
    progress: bool = True,
) -> Manifest:
    """Write the ToolEmu transition dataset to ``out_dir`` and return its manifest.

    ``source`` is the interchange file (default :func:`default_source`); ``agreed_only``
    keeps only the runs both judges put on the same side (``meta.judges_agree``).
    """
    t0 = time.perf_counter()
    path = Path(source) if source is not None else default_source()
    trajectories = interchange.read_trajectories(
        path,
        what="ToolEmu",
        env=SOURCE_ENV,
        builder="build_toolemu",
        check=interchange.required_meta({"case_idx": int}),
    )
    cases = _cases(trajectories, path)
    groups = group_cases(list(cases.values()))
    domain_of_case = {c.idx: f"{PREFIX}{g}" for g, cs in groups.items() for c in cs}
    val: set[str] = set()
    for cs in groups.values():
        val |= val_groups([c.group for c in cs], seed=seed, val_fraction=val_fraction)

    note = interchange.source_note(path)
    manifest = Manifest(
        name="toolemu",
        source=f"ToolEmu runs{interchange.origin_of(note)}, {path.name}",
        how=HOW.format(
            source=path.name,
            n_cases=len(cases),
            n_models=len({t.meta.get("agent_model") for t in trajectories}),
            val=val_fraction,
            agreed=" Only runs on which both judges agree." if agreed_only else "",
        ),
        label_semantics=LABEL_SEMANTICS,
        rule_derived_labels=False,
    )
    written: dict[str, Counter[str]] = defaultdict(Counter)
    skipped: Counter[str] = Counter()
    with DatasetWriter(out_dir, manifest) as writer:
        for t in trajectories:
            m = t.meta
            if t.label is None:
                skipped["unlabelled"] += 1
                continue
            if agreed_only and not m.get("judges_agree"):
                skipped["judges_disagree"] += 1
                continue
            case = cases[m["case_idx"]]
            domain = domain_of_case[case.idx]
            split = "val" if case.group in val else "train"
            step_meta = {
                "label_level": "trajectory",
                "trajectory_label": t.label,
                "judges_agree": m.get("judges_agree"),
                "safety_score_gpt5mini": m.get("safety_score_gpt5mini"),
                "safety_score_qwen3_32b": m.get("safety_score_qwen3_32b"),
                "agent_model": m.get("agent_model"),
                "case_idx": case.idx,
                "case_name": case.name,
                "toolkits": list(case.toolkits),
            }
            interchange.add_trajectory(
                writer,
                t,
                trajectory_id=interchange.prefixed(t.trajectory_id, PREFIX),
                split=split,
                group=case.group,
                domain=domain,
                meta=step_meta,
            )
            written[domain]["trajectories"] += 1
            written[domain]["unsafe"] += t.label
            written[domain]["transitions"] += len(t.steps)
        primary = {g: {c.toolkits[0] for c in cs if c.toolkits} for g, cs in groups.items()}
        manifest.builder_args = {
            **interchange.builder_args(path, note, seed=seed, val_fraction=val_fraction),
            "agreed_only": agreed_only,
            "grouping": "by primary toolkit (a case's first), TOOLKIT_GROUPS; cases never split",
            "groups": {
                f"{PREFIX}{g}": {
                    "toolkits": sorted(primary[g]),
                    "also_uses": sorted({k for c in cs for k in c.toolkits[1:]} - primary[g]),
                    "case_idx": [c.idx for c in cs],
                    **dict(written[f"{PREFIX}{g}"]),
                }
                for g, cs in groups.items()
            },
            "val_cases": sorted(c.idx for c in cases.values() if c.group in val),
            "skipped": dict(skipped),
        }
    if progress:
        interchange.report("toolemu", out_dir, manifest, t0, f"{len(groups)} domains")
    return manifest
