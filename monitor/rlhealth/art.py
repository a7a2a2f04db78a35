"""RL health of image- and video-generation runs trained with ART (DESIGN §5, seeds "ART").

    MediaRollout / ArtIteration records → per-prompt signals → close versions →
    version signals → alerts (edge-triggered) → metrics

Per prompt and policy version: the K endpoints' rewards (scalar and per reward model),
``Z_c`` (the trainer's, else the spread of the K rewards) and the endpoints' diversity
(mean pairwise distance of their embeddings from the world model's vision encoder). Per
version: the trainer's masked-state share, mean drift norm ‖d‖ and ⟨d, G⟩, the share of
prompts with no learning signal (``Z_c`` under a floor), the reward of every head.

Alerts, each judged on closed versions against the run's own first versions (baselines):

- ``art_mask``: the masked share climbs above its baseline (the trust region fights the
  updates);
- ``art_drift``: the mean drift norm grows a factor over its baseline;
- ``art_no_signal``: too many prompts whose K rewards are equal;
- ``art_collapse`` (per prompt): the reward rises while the prompt's endpoints collapse
  onto each other (reward hacking / mode collapse);
- ``art_reward_divergence`` (per reward model): one head's reward rises far past the
  others' (a weighted-sum reward gamed on one head).

A version is closed once a version ``close_lag`` above it has been seen (a file in order),
or once nothing arrived for it for ``close_after_s`` while a later one exists (a stream).
"""

from __future__ import annotations

import dataclasses
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from monitor.rlhealth.alerts import Alert, AlertLatch, condition_key
from monitor.rlhealth.formulas import mean_pairwise_distance, reward_normaliser
from monitor.rlhealth.metrics import RLHealthMetrics
from monitor.rlhealth.signals import ArtVersionSignals, as_dict
from streams.media import ArtIteration, MediaRollout

Embed = Callable[[Sequence[str]], np.ndarray]  # thumbnails (data URIs) → (N, D) embeddings


def vision_embedder(bundle: str | Path) -> Embed:
    """The vision tower of the world-model bundle at ``bundle`` as an :data:`Embed`, loaded on
    first use (a run with no thumbnails never loads it); the bundle's files are checked now."""
    from worldmodel.score import WEIGHTS_FILE

    path = Path(bundle).expanduser()
    if not (path / "config.json").exists() or not (path / WEIGHTS_FILE).exists():
        raise FileNotFoundError(f"{path}: not a world-model bundle (no config.json and weights)")
    loaded: list[Embed] = []

    def embed(thumbnails: Sequence[str]) -> np.ndarray:
        if not loaded:
            from worldmodel.vision import ImageEmbedder

            loaded.append(ImageEmbedder.load(path).embed)
        return loaded[0](thumbnails)

    return embed


@dataclass(frozen=True)
class ArtConfig:
    """Alert bounds of an ART run; every baseline is the run's own first versions."""

    baseline_versions: int = 8
    z_floor: float = 1e-3  # Z_c below this: the prompt carries no learning signal
    no_signal_share: float = 0.25  # alert when the share of such prompts is above this ...
    no_signal_rise: float = 0.15  # ... and this much above its baseline
    mask_rise: float = 0.1  # alert when the masked share is this much over its baseline ...
    mask_sd: float = 4.0  # ... and this many baseline standard deviations
    drift_growth: float = 2.0  # alert when mean ‖d‖ exceeds this factor of its baseline
    collapse_drop: float = 0.5  # alert when a prompt's diversity falls by this share ...
    collapse_sd: float = 3.0  # ... and this many baseline sd (of log diversity) ...
    collapse_window: int = 2  # ... averaged over this many versions, against the
    collapse_gap: int = 2  # ... baseline versions that end this many versions before, ...
    collapse_reward_rise: float = 0.0  # ... while its reward is above its baseline by this
    collapse_reward_sd: float = 2.0  # ... and this many baseline sd
    divergence_sd: float = 1.0  # a head's change minus the others' median, in baseline sd,
    divergence_window: int = 3  # ... over this many versions (sd: within a prompt's K)
    trend_window: int = 5  # versions in the masked share's trend (slope per version)
    close_lag: int | None = 1
    close_after_s: float | None = None


@dataclass(frozen=True)
class PromptSignals:
    """One prompt's K endpoints at one version."""

    prompt_id: str
    version: int
    endpoints: int
    reward_mean: float
    head_means: dict[str, float]
    head_sq_means: dict[str, float]  # mean of squares, for the heads' baseline spread
    z_c: float
    diversity: float | None  # mean pairwise embedding distance; None: under two thumbnails


def prompt_signals(rollout: MediaRollout, embed: Embed | None = None) -> PromptSignals:
    """The signals of one rollout record; ``embed`` maps its thumbnails to embeddings."""
    heads = rollout.heads
    values = np.array([[e.rewards[h] for h in heads] for e in rollout.endpoints])
    scalar = np.array(rollout.scalar_rewards())
    thumbs = [e.thumbnail for e in rollout.endpoints if e.thumbnail]
    diversity = None
    if embed is not None and len(thumbs) >= 2:
        diversity = mean_pairwise_distance(embed(thumbs))
    return PromptSignals(
        prompt_id=rollout.prompt_id,
        version=rollout.policy_version,
        endpoints=len(rollout.endpoints),
        reward_mean=float(scalar.mean()),
        head_means={h: float(v) for h, v in zip(heads, values.mean(axis=0), strict=True)},
        head_sq_means={h: float(v) for h, v in zip(heads, (values**2).mean(axis=0), strict=True)},
        z_c=rollout.z_c if rollout.z_c is not None else reward_normaliser(scalar),
        diversity=diversity,
    )


def _mean(xs: Sequence[float]) -> float | None:
    return float(np.mean(xs)) if xs else None


def _slope(ys: Sequence[float]) -> float | None:
    if len(ys) < 2:
        return None
    x = np.arange(len(ys), dtype=np.float64)
    return float(np.polyfit(x, np.asarray(ys, dtype=np.float64), 1)[0])


# --- alert rules: pure functions of the closed versions ---------------------------------


def mask_alert(closed: Sequence[ArtVersionSignals], cfg: ArtConfig) -> Alert | None:
    """The masked share of the latest closed version is ``mask_rise`` and ``mask_sd``
    baseline standard deviations above the baseline's mean."""
    seen = [v for v in closed if v.masked_share is not None]
    if len(seen) <= cfg.baseline_versions:
        return None
    base = np.array([v.masked_share for v in seen[: cfg.baseline_versions]], dtype=np.float64)
    cur = seen[-1]
    assert cur.masked_share is not None
    bound = float(base.mean()) + max(cfg.mask_rise, cfg.mask_sd * float(base.std()))
    if cur.masked_share <= bound:
        return None
    return Alert(
        "art_mask",
        cur.version,
        cur.masked_share,
        bound,
        f"{cur.masked_share:.0%} of states masked by the trust region at version {cur.version} "
        f"(baseline {base.mean():.0%}, bound {bound:.0%}): the updates push past the trust "
        "region",
    )


def drift_norm_alert(closed: Sequence[ArtVersionSignals], cfg: ArtConfig) -> Alert | None:
    """The mean drift norm ‖d‖ exceeds ``drift_growth`` times its baseline median."""
    seen = [v for v in closed if v.drift_norm_mean is not None]
    if len(seen) <= cfg.baseline_versions:
        return None
    base = float(np.median([v.drift_norm_mean for v in seen[: cfg.baseline_versions]]))
    cur = seen[-1]
    assert cur.drift_norm_mean is not None
    bound = cfg.drift_growth * base
    if base <= 0 or cur.drift_norm_mean <= bound:
        return None
    return Alert(
        "art_drift",
        cur.version,
        cur.drift_norm_mean,
        bound,
        f"mean drift norm ‖d‖ = {cur.drift_norm_mean:.3g} at version {cur.version} is "
        f"{cur.drift_norm_mean / base:.1f}x its baseline ({base:.3g})",
    )


def no_signal_alert(closed: Sequence[ArtVersionSignals], cfg: ArtConfig) -> Alert | None:
    """Too many prompts whose K rewards are equal (``Z_c`` under the floor)."""
    seen = [v for v in closed if v.no_signal_share is not None]
    if len(seen) <= cfg.baseline_versions:
        return None
    base = float(np.mean([v.no_signal_share for v in seen[: cfg.baseline_versions]]))
    cur = seen[-1]
    assert cur.no_signal_share is not None
    bound = max(cfg.no_signal_share, base + cfg.no_signal_rise)
    if cur.no_signal_share <= bound:
        return None
    return Alert(
        "art_no_signal",
        cur.version,
        cur.no_signal_share,
        bound,
        f"{cur.no_signal_share:.0%} of prompts at version {cur.version} have equal rewards "
        f"(Z_c < {cfg.z_floor:g}) and teach nothing (baseline {base:.0%})",
    )


def collapse_alert(
    history: Sequence[PromptSignals], cfg: ArtConfig
) -> tuple[Alert | None, bool]:
    """``(alert, judged)`` for one prompt's versions: over the last ``collapse_window``
    versions its endpoints' diversity (log, averaged) fell below its baseline (the median of
    the ``baseline_versions`` that end ``collapse_gap`` versions before them: a rolling
    baseline, so the slow narrowing of healthy training is absorbed and a collapse, which
    takes a few versions, is not) by more than ``log 1/(1 − collapse_drop)`` and
    ``collapse_sd`` baseline sd (from the MAD), while its reward rose
    ``collapse_reward_sd`` baseline sd (and ``collapse_reward_rise``) above its baseline."""
    seen = [p for p in history if p.diversity is not None and p.diversity > 0]
    w, lag = cfg.collapse_window, cfg.collapse_window + cfg.collapse_gap
    if len(seen) < cfg.baseline_versions + lag:
        return None, False
    diversity = np.array([p.diversity for p in seen], dtype=np.float64)
    base = seen[-(lag + cfg.baseline_versions) : -lag]  # rolling: healthy drift is absorbed
    logs = np.log(diversity[-(lag + cfg.baseline_versions) : -lag])
    centre = float(np.median(logs))  # median and MAD: one odd baseline version moves neither
    spread = 1.4826 * float(np.median(np.abs(logs - centre)))
    rewards = np.array([p.reward_mean for p in base])
    drop = centre - float(np.mean(np.log(diversity[-w:])))
    need_drop = max(-np.log(1.0 - cfg.collapse_drop), cfg.collapse_sd * spread)
    cur = seen[-1]
    rise = cur.reward_mean - float(rewards.mean())
    need_rise = max(cfg.collapse_reward_rise, cfg.collapse_reward_sd * float(rewards.std()))
    if not (drop > need_drop and rise > need_rise):
        return None, True
    base_div, now_div = float(np.exp(centre)), float(np.exp(centre - drop))
    return (
        Alert(
            "art_collapse",
            cur.version,
            now_div,
            float(np.exp(centre - need_drop)),
            f"prompt {cur.prompt_id} at version {cur.version}: reward {rewards.mean():.3f} → "
            f"{cur.reward_mean:.3f} while its endpoints collapse onto each other (diversity "
            f"{base_div:.3g} → {now_div:.3g}): possible reward hacking or mode collapse",
            subject=cur.prompt_id,
        ),
        True,
    )


def head_divergence(
    closed: Sequence[ArtVersionSignals], spread: dict[str, float], cfg: ArtConfig
) -> dict[str, float]:
    """Per reward model: its change over the last ``divergence_window`` versions (against
    the mean of the window before), in baseline standard deviations, minus the median
    change of the other heads. Empty before the baseline is set, or with one head."""
    w = cfg.divergence_window
    if len(closed) <= cfg.baseline_versions or len(closed) < 2 * w + 1:
        return {}
    before = closed[-(2 * w + 1) : -w]
    cur = closed[-1]
    heads = sorted(h for h in cur.head_means if spread.get(h, 0.0) > 0)
    change = {}
    for h in heads:
        ref = [v.head_means[h] for v in before if h in v.head_means]
        if ref:
            change[h] = (cur.head_means[h] - float(np.mean(ref))) / spread[h]
    if len(change) < 2:
        return {}
    return {
        h: float(c - np.median([o for k, o in change.items() if k != h]))
        for h, c in change.items()
    }


def divergence_alerts(
    cur: ArtVersionSignals, weights: dict[str, float], cfg: ArtConfig
) -> dict[str, Alert | None]:
    """Per head: an alert when its divergence is over ``divergence_sd``, else None."""
    out: dict[str, Alert | None] = {}
    for h, div in cur.head_divergence.items():
        if div <= cfg.divergence_sd:
            out[h] = None
            continue
        w = weights.get(h)
        weighted = f" (weight {w:g} in the reward)" if w is not None else ""
        out[h] = Alert(
            "art_reward_divergence",
            cur.version,
            div,
            cfg.divergence_sd,
            f"reward model {h}{weighted} rose {div:.1f} baseline sd more than the other "
            f"reward models over the {cfg.divergence_window} versions to {cur.version}: the "
            "reward may be gamed on that head",
            subject=h,
        )
    return out


# --- the state machine -------------------------------------------------------------------


class ArtMonitor:
    """Rolling ART health over rollout and iteration records (stream and file alike)."""

    def __init__(
        self,
        config: ArtConfig | None = None,
        metrics: RLHealthMetrics | None = None,
        embed: Embed | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config or ArtConfig()
        self.metrics = metrics
        self.embed = embed
        self.clock = clock
        self.closed: list[ArtVersionSignals] = []
        self.latch = AlertLatch(metrics.observe_alert if metrics is not None else None)
        self.alerts = self.latch.raised
        self.rollouts = 0
        self.duplicates = 0
        self.late = 0
        self._open: dict[int, dict[str, PromptSignals]] = defaultdict(dict)
        self._iterations: dict[int, ArtIteration] = {}
        self._arrival: dict[int, float] = {}
        self._newest: int | None = None
        self._closed_upto: int | None = None
        self._prompts: dict[str, list[PromptSignals]] = defaultdict(list)
        self._weights: dict[str, float] = {}
        self._head_moments: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])

    def _arrive(self, version: int, now: float) -> bool:
        """Note a record of ``version``; False when that version is closed already."""
        if self._closed_upto is not None and version <= self._closed_upto:
            self.late += 1
            return False
        self._arrival[version] = now
        if self._newest is None or version > self._newest:
            self._newest = version
        return True

    def observe_rollout(self, rollout: MediaRollout, now: float | None = None) -> list[Alert]:
        """Take one prompt's endpoints; returns the alerts of the versions it closed."""
        now = self.clock() if now is None else now
        v = rollout.policy_version
        if not self._arrive(v, now):
            return self.tick(now)
        if rollout.prompt_id in self._open[v]:
            self.duplicates += 1  # a redelivery: the first one counts
            return self.tick(now)
        self.rollouts += 1
        self._weights.update({h: rollout.weight(h) for h in rollout.heads})
        self._open[v][rollout.prompt_id] = prompt_signals(rollout, self.embed)
        return self.tick(now)

    def observe_iteration(self, it: ArtIteration, now: float | None = None) -> list[Alert]:
        """Take the trainer's statistics of one iteration."""
        now = self.clock() if now is None else now
        if self._arrive(it.policy_version, now):
            self._iterations[it.policy_version] = it
        return self.tick(now)

    def observe(self, record: MediaRollout | ArtIteration, now: float | None = None) -> list[Alert]:
        if isinstance(record, MediaRollout):
            return self.observe_rollout(record, now)
        return self.observe_iteration(record, now)

    def tick(self, now: float | None = None) -> list[Alert]:
        """Close the versions that are done and judge them."""
        now = self.clock() if now is None else now
        cfg, out = self.config, []
        for v in sorted(set(self._open) | set(self._iterations)):
            if self._newest is None or v >= self._newest:
                break
            by_lag = cfg.close_lag is not None and self._newest >= v + cfg.close_lag
            idle = cfg.close_after_s is not None and now - self._arrival.get(v, now) >= (
                cfg.close_after_s
            )
            if not (by_lag or idle):
                break
            out += self._close(v)
        return out

    def finish(self) -> list[Alert]:
        """Close every open version (end of a file, or shutdown)."""
        out: list[Alert] = []
        for v in sorted(set(self._open) | set(self._iterations)):
            out += self._close(v)
        return out

    @property
    def open_versions(self) -> list[int]:
        return sorted(set(self._open) | set(self._iterations))

    def _close(self, v: int) -> list[Alert]:
        prompts = list(self._open.pop(v, {}).values())
        it = self._iterations.pop(v, None)
        self._arrival.pop(v, None)
        self._closed_upto = v
        for p in prompts:
            self._prompts[p.prompt_id].append(p)
            if len(self.closed) < self.config.baseline_versions:  # the heads' baseline spread
                for h, m in p.head_means.items():  # within a prompt's K endpoints, pooled
                    acc = self._head_moments[h]
                    acc[0] += p.endpoints
                    acc[1] += max(p.head_sq_means[h] - m * m, 0.0) * p.endpoints
        self.closed.append(self._version_signals(v, prompts, it))
        out: list[Alert] = []
        collapsed = []
        for p in prompts:
            alert, judged = collapse_alert(self._prompts[p.prompt_id], self.config)
            if judged:
                self._raise(condition_key("art_collapse", p.prompt_id), alert, out)
            if alert is not None:
                collapsed.append(p.prompt_id)
        vs = self.closed[-1] = dataclasses.replace(
            self.closed[-1],
            head_divergence=head_divergence(self.closed, self._head_spread(), self.config),
            collapsed_prompts=tuple(collapsed),
        )
        if self.metrics is not None:
            self.metrics.set_art_version(vs)
        return out + self._judge(vs)

    def _head_spread(self) -> dict[str, float]:
        """Per reward model: the baseline's spread of its scores within one prompt's K
        endpoints (the yardstick of a head's change; prompts differ far more than that)."""
        return {h: float(np.sqrt(var / n)) for h, (n, var) in self._head_moments.items() if n}

    def _version_signals(
        self, v: int, prompts: list[PromptSignals], it: ArtIteration | None
    ) -> ArtVersionSignals:
        cfg = self.config
        n = sum(p.endpoints for p in prompts)
        heads = sorted({h for p in prompts for h in p.head_means})
        z_by_prompt = {p.prompt_id: p.z_c for p in prompts}
        if it is not None:  # the trainer's Z_c wins where it gives one
            z_by_prompt.update(it.z_c)
        z = list(z_by_prompt.values())
        masked = [c.masked_share for c in self.closed if c.masked_share is not None]
        if it is not None:
            masked.append(it.masked_share)
        return ArtVersionSignals(
            version=v,
            prompts=len(prompts),
            endpoints=n,
            reward_mean=(sum(p.reward_mean * p.endpoints for p in prompts) / n) if n else None,
            head_means={
                h: sum(p.head_means[h] * p.endpoints for p in prompts if h in p.head_means)
                / sum(p.endpoints for p in prompts if h in p.head_means)
                for h in heads
            },
            no_signal_share=(sum(x < cfg.z_floor for x in z) / len(z)) if z else None,
            diversity_mean=_mean([p.diversity for p in prompts if p.diversity is not None]),
            masked_share=None if it is None else it.masked_share,
            masked_share_trend=_slope(masked[-cfg.trend_window :]) if it is not None else None,
            drift_norm_mean=None if it is None else it.drift_norm_mean,
            drift_dot_g_mean=None if it is None else it.drift_dot_g_mean,
        )

    def _judge(self, vs: ArtVersionSignals) -> list[Alert]:
        out: list[Alert] = []
        cfg = self.config
        for kind, rule in (
            ("art_mask", mask_alert),
            ("art_drift", drift_norm_alert),
            ("art_no_signal", no_signal_alert),
        ):
            self._raise(condition_key(kind), rule(self.closed, cfg), out)  # type: ignore[arg-type]
        for head, alert in divergence_alerts(vs, self._weights, cfg).items():
            self._raise(condition_key("art_reward_divergence", head), alert, out)
        return out

    def _raise(self, condition: str, alert: Alert | None, into: list[Alert]) -> None:
        """Judge ``condition`` (``alert`` if it holds, else None); raise only on its rising
        edge: a condition that stays in the alert state over many versions is one alert."""
        if (raised := self.latch.judge(condition, alert)) is not None:
            into.append(raised)

    def report(self) -> dict[str, Any]:
        """Everything judged so far, JSON-ready (the ``art`` part of ``monitor rlhealth``)."""
        return {
            "rollouts": self.rollouts,
            "duplicates": self.duplicates,
            "late": self.late,
            "prompts": len(self._prompts),
            "versions": [as_dict(v) for v in self.closed],
            "alerts": [as_dict(a) for a in self.alerts],
            "alerts_active": [as_dict(a) for a in self.latch.active],
        }
