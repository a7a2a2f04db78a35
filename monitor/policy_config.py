"""The tier policy's configuration: each tier's signals, budget, models and reviewer, the
tool rules, and the policy file that sets them (:func:`load_policy_config`; the format is in
:mod:`monitor.tiers`). Invalid settings are one :class:`PolicyError` naming the key.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from monitor.scorers import UnknownSignal, check_tier_signals, default_signals
from monitor.tool_rules import ToolRules
from monitor.trajectory import DEFAULT_TRAJECTORY_BUDGET

TIERS = ("L0", "L1", "L2", "L3")
DEFAULT_BUDGETS = (0.20, 0.02, 0.002)


class PolicyError(ValueError):
    """A policy file or a calibration that cannot be used; the message says why."""


# --- configuration ---------------------------------------------------------------


@dataclass(frozen=True)
class TierConfig:
    """One scoring tier (L0, L1, L2): the signals it adds and the share it passes up."""

    name: str
    signals: tuple[str, ...]
    budget: float
    models: Mapping[str, str | None] = field(default_factory=dict)
    reviewer: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class PolicyConfig:
    tiers: tuple[TierConfig, TierConfig, TierConfig]
    flag_tier: int = 3
    block_budget: float = 0.002
    C: float = 1.0  # inverse L2 strength of the stacking
    source: str = "defaults"
    trajectory_budget: float = DEFAULT_TRAJECTORY_BUDGET  # benign trajectories flagged
    # per-tool allow / deny / monitor rules, and fail open or closed (monitor.tool_rules)
    tools: ToolRules = field(default_factory=ToolRules)

    @property
    def budgets(self) -> tuple[float, ...]:
        return tuple(t.budget for t in self.tiers)

    def gate_signals(self, gate: int) -> tuple[str, ...]:
        """Every signal known at gate ``gate`` (0: after L0, 1: after L1, 2: after L2)."""
        out: list[str] = []
        for t in self.tiers[: gate + 1]:
            out.extend(s for s in t.signals if s not in out)
        return tuple(out)

    def models(self) -> dict[str, str | None]:
        """Every model bundle the tiers name (folder, or None for the default)."""
        out: dict[str, str | None] = {}
        for t in self.tiers:
            out.update(t.models)
        return out

    def model(self, name: str) -> str | None:
        for t in self.tiers:
            if name in t.models:
                return t.models[name]
        return None

    @property
    def reviewer(self) -> Mapping[str, Any]:
        return self.tiers[2].reviewer or {}

    def to_dict(self) -> dict[str, Any]:
        return {
            "flag_tier": self.flag_tier,
            "block_budget": self.block_budget,
            "C": self.C,
            "source": self.source,
            "trajectory_budget": self.trajectory_budget,
            **({"tools": self.tools.to_dict()} if self.tools else {}),
            "tiers": {
                t.name: {
                    "budget": t.budget,
                    "signals": list(t.signals),
                    "models": dict(t.models),
                    **({"reviewer": dict(t.reviewer)} if t.reviewer is not None else {}),
                }
                for t in self.tiers
            },
        }


def default_policy_config() -> PolicyConfig:
    """Every signal the scorers of each tier produce (:mod:`monitor.scorers`), at the
    default budgets."""
    l0, l1, l2 = default_signals()
    return PolicyConfig(
        tiers=(
            TierConfig("L0", l0, DEFAULT_BUDGETS[0], {"worldmodel": None}),
            TierConfig("L1", l1, DEFAULT_BUDGETS[1], {"probes": None}),
            TierConfig("L2", l2, DEFAULT_BUDGETS[2], reviewer={"backend": "local"}),
        )
    )


def policy_config_from_dict(d: Mapping[str, Any], source: str = "<dict>") -> PolicyConfig:
    """Validate a parsed policy file; one :class:`PolicyError` names the bad key."""

    def fail(msg: str) -> PolicyError:
        return PolicyError(f"{source}: {msg}")

    if not isinstance(d, Mapping):
        raise fail("a policy file is a mapping with a 'tiers' key")
    unknown = set(d) - {"flag_tier", "block_budget", "C", "tiers", "source", "trajectory_budget",
                        "tools"}
    if unknown:
        raise fail(f"unknown key {sorted(unknown)[0]!r}")
    base = default_policy_config()
    tiers_in = d.get("tiers") or {}
    if not isinstance(tiers_in, Mapping):
        raise fail("'tiers' must map L0, L1, L2 to their settings")
    extra = set(tiers_in) - {"L0", "L1", "L2", "L3"}
    if extra:
        raise fail(f"unknown tier {sorted(extra)[0]!r} (tiers are L0, L1, L2, L3)")
    tiers: list[TierConfig] = []
    for default in base.tiers:
        t = tiers_in.get(default.name) or {}
        if not isinstance(t, Mapping):
            raise fail(f"tiers.{default.name} must be a mapping")
        bad = set(t) - {"budget", "signals", "models", "reviewer"}
        if bad:
            raise fail(f"unknown key tiers.{default.name}.{sorted(bad)[0]}")
        budget = t.get("budget", default.budget)
        if not isinstance(budget, int | float) or not 0 < float(budget) <= 1:
            raise fail(f"tiers.{default.name}.budget must be a fraction in (0, 1], got {budget!r}")
        signals = t.get("signals", list(default.signals))
        if not isinstance(signals, list) or not all(isinstance(s, str) for s in signals):
            raise fail(f"tiers.{default.name}.signals must be a list of signal names")
        try:
            check_tier_signals(len(tiers), signals)
        except UnknownSignal as e:
            raise fail(str(e)) from None
        models = t.get("models", dict(default.models))
        if not isinstance(models, Mapping):
            raise fail(f"tiers.{default.name}.models must map a model name to a bundle folder")
        reviewer = t.get("reviewer", default.reviewer)
        if reviewer is not None and not isinstance(reviewer, Mapping):
            raise fail(f"tiers.{default.name}.reviewer must be a mapping of reviewer settings")
        tiers.append(
            TierConfig(default.name, tuple(signals), float(budget), dict(models), reviewer)
        )
    budgets = [t.budget for t in tiers]
    if any(b2 > b1 for b1, b2 in zip(budgets, budgets[1:], strict=False)):
        raise fail(f"budgets must not grow from tier to tier, got {budgets}")
    if not tiers[0].signals:
        raise fail("tiers.L0.signals is empty: L0 needs at least one signal")
    flag_tier = d.get("flag_tier", base.flag_tier)
    if flag_tier not in (1, 2, 3):
        raise fail(f"flag_tier must be 1, 2 or 3, got {flag_tier!r}")
    block = d.get("block_budget", base.block_budget)
    if not isinstance(block, int | float) or not 0 < float(block) <= 1:
        raise fail(f"block_budget must be a fraction in (0, 1], got {block!r}")
    C = d.get("C", base.C)
    if not isinstance(C, int | float) or C <= 0:
        raise fail(f"C must be a positive number, got {C!r}")
    traj = d.get("trajectory_budget", base.trajectory_budget)
    if not isinstance(traj, int | float) or not 0 < float(traj) <= 1:
        raise fail(f"trajectory_budget must be a fraction in (0, 1], got {traj!r}")
    t0, t1, t2 = tiers
    tools = ToolRules.from_dict(d["tools"], fail) if d.get("tools") is not None else ToolRules()
    return PolicyConfig(
        (t0, t1, t2), int(flag_tier), float(block), float(C), source, float(traj), tools
    )


def load_policy_config(path: str | Path | None = None) -> PolicyConfig:
    """A YAML policy file (``None``: the defaults)."""
    if path is None:
        return default_policy_config()
    import yaml

    p = Path(path).expanduser()
    try:
        raw = yaml.safe_load(p.read_text())
    except FileNotFoundError:
        raise PolicyError(f"{p}: no such policy file") from None
    except yaml.YAMLError as e:
        raise PolicyError(f"{p}: not valid YAML ({e})") from None
    return policy_config_from_dict(raw or {}, source=str(p))
