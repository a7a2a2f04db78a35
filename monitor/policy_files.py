"""Where a policy file names its model folders, and reading a packed one from its own folder.

Kept apart from :mod:`monitor.shipped` (packing) so that loading a policy
(:meth:`monitor.tiers.CalibratedPolicy.load`) imports nothing of the packers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def model_fields(policy: dict[str, Any]) -> list[tuple[dict[str, Any], str]]:
    """The (mapping, key) pairs of a policy dict that hold a model folder."""
    out: list[tuple[dict[str, Any], str]] = []
    models = policy.get("data", {}).get("models") or {}
    out += [(models, k) for k in models]
    for tier in (policy.get("config", {}).get("tiers") or {}).values():
        ms = tier.get("models") or {}
        out += [(ms, k) for k in ms if ms[k]]
        if tier.get("reviewer") and tier["reviewer"].get("model_path"):
            out.append((tier["reviewer"], "model_path"))
    return out


def rebase_policy(policy: dict[str, Any], base: Path) -> dict[str, Any]:
    """``policy`` (a policy file's dict) with each relative model folder that exists under
    ``base`` made absolute (a packed policy names its bundles relative to its own folder)."""
    for mapping, key in model_fields(policy):
        value = mapping[key]
        if isinstance(value, str) and not Path(value).is_absolute() and (base / value).exists():
            mapping[key] = str(base / value)
    return policy
