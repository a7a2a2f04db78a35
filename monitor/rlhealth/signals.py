"""Per-call, per-execution, per-group and per-version RL-health signals.

``call_signals`` and ``execution_signals`` read one rebuilt
:class:`~streams.tito.ExecutionTree`; ``group_signals`` and
``version_signals`` aggregate what the stream collected. All values are
frozen dataclasses; ``as_dict`` makes any of them JSON.

Where the numbers come from in a TITO record: ``output_logprobs`` are the
behaviour (rollout engine) log-probabilities, ``trainer_logprobs`` the trainer's
for the same tokens. Their difference is read two ways: summed per sequence it
is BRAT's drift ``M`` (grouped by the trainer's version, and by the optional
``reuse_pass`` of multi-pass reuse), per token it is the rollout–training
mismatch (grouped by the rollout's ``policy_version``). A record may name the
trainer's version in an extra ``trainer_version`` key; otherwise it is the
execution's ``consumed_version``, else its ``policy_version``.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from monitor.rlhealth import formulas as f
from streams.records import TitoCall
from streams.tito import ROLE_PRIORITY, ExecutionTree


def as_dict(obj: Any) -> dict[str, Any]:
    """A signal dataclass as JSON-ready dict (tuples become lists)."""
    return json_ready(dataclasses.asdict(obj))


def json_ready(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): json_ready(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_ready(v) for v in value]
    if isinstance(value, float) and not np.isfinite(value):
        return None
    if isinstance(value, np.generic):
        return value.item()
    return value


def _extra(record: Any, key: str) -> Any:
    return (record.model_extra or {}).get(key)


@dataclass(frozen=True)
class CallSignals:
    """Drift and mismatch of one model call (one assistant turn, one sequence)."""

    call_id: str
    role: str
    tokens: int
    policy_version: int | None
    trainer_version: int | None
    reuse_pass: int
    drift_nats: float  # M = Σ (log π_train − log π_rollout)
    out_of_trust_share: float  # share of tokens with |ρ − 1| > δ
    log_turn_ratio: float  # log ρ_t = Σ log ρ_{t,i}
    mismatch_abs_mean: float  # mean |log p_train − log p_rollout|
    mismatch_abs_max: float
    k3_kl: float  # Σ (r − 1 − log r)


@dataclass(frozen=True)
class ExecutionSignals:
    """One ended execution: staleness, shape, admission, drift and its end."""

    execution_id: str
    query_id: str
    dispatch_version: int | None
    consumed_version: int | None
    staleness: int | None  # consumed − dispatch
    duration_s: float
    timed_out: bool
    reward: float | None
    harm: float | None
    calls: int
    leaves: int
    admitted: int  # trajectories admitted under J_max
    admitted_roles: tuple[str, ...]  # leaf role of each admitted trajectory, in order
    dropped: int
    node_occurrences: int
    unique_nodes: int
    dedup_ratio: float  # unique / occurrences (1.0: nothing shared)
    reuse_pass: int
    call_signals: tuple[CallSignals, ...]


def _trainer_version(call: TitoCall, consumed: int | None) -> int | None:
    v = _extra(call, "trainer_version")
    if isinstance(v, int):
        return v
    return consumed if consumed is not None else call.policy_version


def _reuse_pass(record: Any) -> int:
    v = _extra(record, "reuse_pass")
    return v if isinstance(v, int) else 0


def call_signals(
    call: TitoCall, *, consumed_version: int | None = None, delta: float = 0.8
) -> CallSignals | None:
    """The drift and mismatch of one call, or None when it has no trainer log-probs."""
    if call.trainer_logprobs is None or call.output_logprobs is None:
        return None
    new, old = call.trainer_logprobs, call.output_logprobs
    lr = f.token_log_ratios(new, old)
    mism = np.abs(lr)
    return CallSignals(
        call_id=call.call_id,
        role=call.role,
        tokens=int(lr.size),
        policy_version=call.policy_version,
        trainer_version=_trainer_version(call, consumed_version),
        reuse_pass=_reuse_pass(call),
        drift_nats=float(lr.sum()),
        out_of_trust_share=f.out_of_trust_share(new, old, delta),
        log_turn_ratio=float(lr.sum()),
        mismatch_abs_mean=float(mism.mean()) if mism.size else 0.0,
        mismatch_abs_max=float(mism.max()) if mism.size else 0.0,
        k3_kl=f.k3_kl(new, old),
    )


def admitted_leaves(tree: ExecutionTree, j_max: int) -> list[str]:
    """Leaf call ids admitted under ``j_max``: role priority (main > main_summary >
    sub > sub_summary), then longest path, then id — ``streams.tito.select_trajectories``'
    order, without building the trajectories."""
    ranked = sorted(
        tree.leaves,
        key=lambda leaf: (
            ROLE_PRIORITY[tree.nodes[leaf].role],
            -(tree.nodes[leaf].depth + 1),
            f"{tree.execution_id}/{leaf}",
        ),
    )
    return ranked[:j_max]


def execution_signals(
    tree: ExecutionTree, *, j_max: int = 5, delta: float = 0.8, harm: float | None = None
) -> ExecutionSignals:
    """Everything the RL-health monitor reads from one execution.

    ``harm`` (a harm score in [0, 1], e.g. the world model's for the execution)
    overrides an extra ``harm`` key on the end record.
    """
    calls = [tree.nodes[c].call for c in tree.order]
    end = tree.end
    dispatch = [c.dispatch_version for c in calls if c.dispatch_version is not None]
    dispatch_version = min(dispatch) if dispatch else None
    consumed = end.consumed_version if end is not None else None
    stale = (
        consumed - dispatch_version
        if consumed is not None and dispatch_version is not None
        else None
    )
    starts = [c.started_at for c in calls]
    ends = [c.ended_at for c in calls] + ([end.ended_at] if end is not None else [])
    duration = max(0.0, max(ends) - min(starts)) if starts else 0.0
    if harm is None and end is not None:
        h = _extra(end, "harm")
        harm = float(h) if isinstance(h, int | float) else None
    admitted = admitted_leaves(tree, j_max)
    per_call = tuple(
        s for c in calls if (s := call_signals(c, consumed_version=consumed, delta=delta))
    )
    occurrences = tree.node_occurrences
    return ExecutionSignals(
        execution_id=tree.execution_id,
        query_id=tree.query_id,
        dispatch_version=dispatch_version,
        consumed_version=consumed,
        staleness=stale,
        duration_s=float(duration),
        timed_out=bool(end.timed_out) if end is not None else False,
        reward=end.reward if end is not None else None,
        harm=harm,
        calls=len(calls),
        leaves=len(tree.leaves),
        admitted=len(admitted),
        admitted_roles=tuple(tree.nodes[leaf].role for leaf in admitted),
        dropped=len(tree.leaves) - len(admitted),
        node_occurrences=occurrences,
        unique_nodes=tree.unique_nodes,
        dedup_ratio=tree.unique_nodes / occurrences if occurrences else 1.0,
        reuse_pass=_reuse_pass(end) if end is not None else 0,
        call_signals=per_call,
    )


@dataclass(frozen=True)
class GroupSignals:
    """One execution group (the executions of a query in one training version)."""

    query_id: str
    version: int | None
    size: int
    reward_mean: float
    reward_std: float
    reward_min: float
    reward_max: float
    symmax_advantages: tuple[float, ...]  # in execution-id order
    execution_ids: tuple[str, ...]
    harm_mean: float | None
    reward_harm_corr: float | None  # Pearson within the group, None if undefined
    reward_delta: float | None  # vs the previous group of the same query
    harm_delta: float | None
    reward_hacking: bool


def group_signals(
    executions: Sequence[ExecutionSignals],
    *,
    previous: GroupSignals | None = None,
    rise_tolerance: float = 0.05,
    corr_threshold: float = 0.7,
    corr_min_size: int = 8,
) -> GroupSignals:
    """Reward distribution and SymMax advantages of one group, and the reward-hacking flag.

    A group is flagged when, against the previous group of the same query, its
    mean reward and its mean harm both rose by more than ``rise_tolerance``, or
    when reward and harm correlate within the group above ``corr_threshold``
    (at least ``corr_min_size`` executions with harm scores: fewer correlate by chance).
    """
    ex = sorted(executions, key=lambda e: e.execution_id)
    if not ex:
        raise ValueError("a group needs at least one execution")
    rewards = np.array([e.reward if e.reward is not None else 0.0 for e in ex])
    harms = [e.harm for e in ex]
    known = [(r, h) for r, h in zip(rewards, harms, strict=True) if h is not None]
    harm_mean = float(np.mean([h for _, h in known])) if known else None
    corr: float | None = None
    if len(known) >= corr_min_size:
        rr = np.array([r for r, _ in known])
        hh = np.array([h for _, h in known])
        if rr.std() > 1e-12 and hh.std() > 1e-12:
            corr = float(np.corrcoef(rr, hh)[0, 1])
    reward_mean = float(rewards.mean())
    r_delta = h_delta = None
    if previous is not None:
        r_delta = reward_mean - previous.reward_mean
        if harm_mean is not None and previous.harm_mean is not None:
            h_delta = harm_mean - previous.harm_mean
    rising = (
        r_delta is not None
        and h_delta is not None
        and r_delta > rise_tolerance
        and h_delta > rise_tolerance
    )
    versions = [e.consumed_version for e in ex if e.consumed_version is not None]
    return GroupSignals(
        query_id=ex[0].query_id,
        version=max(versions) if versions else None,
        size=len(ex),
        reward_mean=reward_mean,
        reward_std=float(rewards.std()),
        reward_min=float(rewards.min()),
        reward_max=float(rewards.max()),
        symmax_advantages=tuple(float(a) for a in f.symmax_advantages(rewards)),
        execution_ids=tuple(e.execution_id for e in ex),
        harm_mean=harm_mean,
        reward_harm_corr=corr,
        reward_delta=r_delta,
        harm_delta=h_delta,
        reward_hacking=rising or (corr is not None and corr > corr_threshold),
    )


@dataclass(frozen=True)
class VersionSignals:
    """One training version (the trainer's version at consumption)."""

    version: int
    samples: int
    staleness_mean: float | None
    staleness_hist: Mapping[int, int]
    sequences: int  # calls with trainer log-probabilities
    drift_abs_mean: float | None  # mean_s |M_s|, nats
    drift_rms: float | None  # sqrt(mean_s M_s²)
    out_of_trust_share: float | None  # token-weighted
    mismatch_abs_mean: float | None  # token-weighted mean |Δ log p|
    k3_kl_mean: float | None  # mean per sequence
    reward_mean: float | None
    timeouts: int


def version_signals(
    version: int,
    executions: Sequence[ExecutionSignals],
    calls: Sequence[CallSignals],
) -> VersionSignals:
    """Aggregate the executions consumed at ``version`` and the calls the trainer scored
    at ``version``."""
    stale = [e.staleness for e in executions if e.staleness is not None]
    rewards = [e.reward for e in executions if e.reward is not None]
    tokens = sum(c.tokens for c in calls)
    m = np.array([c.drift_nats for c in calls])
    return VersionSignals(
        version=version,
        samples=len(executions),
        staleness_mean=float(np.mean(stale)) if stale else None,
        staleness_hist=dict(sorted(Counter(stale).items())),
        sequences=len(calls),
        drift_abs_mean=float(np.abs(m).mean()) if calls else None,
        drift_rms=float(np.sqrt(np.mean(m**2))) if calls else None,
        out_of_trust_share=(
            sum(c.out_of_trust_share * c.tokens for c in calls) / tokens if tokens else None
        ),
        mismatch_abs_mean=(
            sum(c.mismatch_abs_mean * c.tokens for c in calls) / tokens if tokens else None
        ),
        k3_kl_mean=float(np.mean([c.k3_kl for c in calls])) if calls else None,
        reward_mean=float(np.mean(rewards)) if rewards else None,
        timeouts=sum(e.timed_out for e in executions),
    )


@dataclass(frozen=True)
class ArtVersionSignals:
    """ART (image / video generation, :mod:`monitor.rlhealth.art`): one closed policy
    version."""

    version: int
    prompts: int
    endpoints: int
    reward_mean: float | None
    head_means: dict[str, float]
    no_signal_share: float | None
    diversity_mean: float | None
    masked_share: float | None
    masked_share_trend: float | None  # least-squares slope over the last versions
    drift_norm_mean: float | None
    drift_dot_g_mean: float | None
    collapsed_prompts: tuple[str, ...] = ()
    head_divergence: dict[str, float] = field(default_factory=dict)
