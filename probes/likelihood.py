"""Task-masked action likelihood: does the user's task make the agent's action more likely?

An action the task does not make more likely was chosen for another reason (an injected
instruction, a drifting plan). For a step, under the local language model (Gemma-3-270M)::

    gain = log p(action | task, context) - log p(action | placeholder, context)

summed over the action's tokens only. The two prompts (``TEMPLATE_VERSION``; its hash is
part of every bundle) are::

    <bos>Task: {task | placeholder}
    Earlier:
    > {history observation}
    < {history action}
    ...                                   (the last ``history`` pairs)
    Observation: {observation}
    Action: {action}

The task is cut to its first ``task_tokens`` tokens; the masked prompt puts the same number
of tokens of a fixed neutral text (``PLACEHOLDER``) in its place, so both prompts have the
same length and positions. The context (history and newest observation) is cut from the
left to ``context_tokens`` tokens (its end is what the action follows), the action to its
first ``action_tokens`` tokens. An action is rendered compactly: the tool call
``name(arg='value', ...)`` where there is one (each value cut to ``value_chars``), else its
text; the tokens that overlap an argument value are the *value tokens*.

:func:`likelihood_features` gives the raw features of each step (``FEATURES``: the gain's
mean and sum over the action tokens, over its value tokens, token counts, the two
log-likelihoods), both prompts of many steps in one right-padded forward pass a batch; the
LM head runs only on the positions that predict action tokens. :class:`GainCalibration`
(standardised, class-balanced logistic regression, JSON-serialisable) turns a feature set
into the signal ``lm_task_gain`` in [0, 1] (higher = the task explains the action less);
:func:`train_likelihood` fits it on the ``train``/``val`` splits, choosing the feature set
and ``C`` by leave-one-domain-out, and writes the bundle: ``bundle.json`` (model id and
hash, template, calibration, LODO figures) and ``features.json`` (the raw features it was
fitted on, :func:`load_features`).
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from vigil.fitting import StandardisedLogit, fit_standardised_logit
from vigil.lm import LanguageModel
from vigil.metrics import auroc

TEMPLATE_VERSION = 1
BUNDLE_VERSION = 1
SIGNAL = "lm_task_gain"
TOKEN_CHARS = 64  # more than any Gemma-3 token spans: a cut in characters never changes tokens
PLACEHOLDER = (
    "I need some help with my account today. Please look at what is there and take care "
    "of it for me with the tools you have, the way a careful assistant would, and tell me "
    "what you did when you are finished. Thank you very much for your help with this, I "
    "really appreciate it. If anything is unclear, use your best judgement and carry on "
    "with the rest, and keep a short note of each thing you changed so that I can check it "
    "later. There is no rush, but I would like it done properly, step by step, without "
    "skipping anything important along the way. Thanks again, and have a good day."
)
FEATURES = (
    "gain_mean", "gain_sum", "n_tokens", "value_gain_mean", "value_gain_sum",
    "n_value_tokens", "gain_max", "gain_min", "logp_mean", "masked_logp_mean",
)
# what the calibration may read; train_likelihood picks one by leave-one-domain-out
FEATURE_SETS: dict[str, tuple[str, ...]] = {
    "gain": ("gain_mean", "gain_sum", "n_tokens"),
    "gain+values": ("gain_mean", "gain_sum", "n_tokens", "value_gain_mean", "value_gain_sum",
                    "n_value_tokens"),
    "gain+values+extremes": ("gain_mean", "gain_sum", "n_tokens", "value_gain_mean",
                             "value_gain_sum", "n_value_tokens", "gain_max", "gain_min"),
}
CS = (0.01, 0.1, 1.0, 10.0)
Log = Callable[[str], None]


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


@dataclass(frozen=True)
class LikelihoodStep:
    """What the likelihood signal reads of one step (history actions already rendered)."""

    task: str
    observation: str
    action: str
    tool: Mapping[str, Any] | None = None  # {"name", "arguments"} when the action is a call
    history: tuple[tuple[str, str], ...] = ()  # (observation, action), oldest first

    @classmethod
    def from_transition(cls, t: Any) -> LikelihoodStep:
        """From a ``worldmodel.datasets.format.Transition``."""
        return cls(t.task, t.observation.text, t.action_text, t.tool, tuple(t.history))


@dataclass(frozen=True)
class RenderedAction:
    text: str
    value_spans: tuple[tuple[int, int], ...] = ()  # character spans of argument values


def _value_repr(v: Any, chars: int) -> tuple[str, int, int]:
    """``repr`` of a (cut) value, and the span of the value inside it (strings: no quotes)."""
    if isinstance(v, str):
        r = repr(v[:chars])
        return r, 1, len(r) - 1
    r = repr(v)[:chars]
    return r, 0, len(r)


def render_call(name: str, arguments: Mapping[str, Any], value_chars: int = 200) -> RenderedAction:
    """``name(key='value', ...)`` and where each value lies in it."""
    text, spans = f"{name}(", []
    for i, (k, v) in enumerate(arguments.items()):
        text += f"{', ' if i else ''}{k}="
        r, a, b = _value_repr(v, value_chars)
        spans.append((len(text) + a, len(text) + b))
        text += r
    return RenderedAction(text + ")", tuple(spans))


def render_action(
    text: str, tool: Mapping[str, Any] | None, *, value_chars: int = 200, max_chars: int = 4096
) -> RenderedAction:
    """The compact action: the call where there is one, else the (head of the) text."""
    if tool and tool.get("name"):
        return render_call(str(tool["name"]), tool.get("arguments") or {}, value_chars)
    return RenderedAction(text[:max_chars])


@dataclass(frozen=True)
class LikelihoodTemplate:
    """How a step is rendered and cut; see the module docstring."""

    task_tokens: int = 96
    context_tokens: int = 128
    action_tokens: int = 40
    history: int = 2
    value_chars: int = 200
    version: int = TEMPLATE_VERSION

    @property
    def hash(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:12]

    def to_dict(self) -> dict[str, int]:
        return asdict(self)

    def context(self, step: LikelihoodStep) -> str:
        """History and newest observation; each text cut to a tail the token cut cannot see."""
        keep = self.context_tokens * TOKEN_CHARS
        parts = []
        hist = step.history[-self.history :] if self.history else ()
        if hist:
            parts.append("Earlier:")
            for obs, act in hist:
                parts.append(f"> {obs[-keep:]}")
                parts.append(f"< {act[-keep:]}")
        parts.append(f"Observation: {step.observation[-keep:]}")
        return "\n".join(parts)

    def action(self, step: LikelihoodStep) -> RenderedAction:
        return render_action(step.action, step.tool, value_chars=self.value_chars,
                             max_chars=self.action_tokens * TOKEN_CHARS)


@dataclass(frozen=True)
class EncodedStep:
    """Both prompts of a step as token ids; the action is their last ``n_action`` tokens."""

    with_task: list[int]
    masked: list[int]
    n_action: int
    value_mask: np.ndarray  # (n_action,) bool: the token overlaps an argument value


def encode_step(tokenizer: Any, template: LikelihoodTemplate, step: LikelihoodStep) -> EncodedStep:
    def ids(text: str) -> list[int]:
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])

    bos = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []
    task = ids(" " + step.task[: template.task_tokens * TOKEN_CHARS])[: template.task_tokens]
    place = ids(" " + PLACEHOLDER)
    while len(place) < len(task):
        place = place + place
    place = place[: len(task)]
    ctx = ids("\n" + template.context(step))[-template.context_tokens :]
    act = template.action(step)
    enc = tokenizer(" " + act.text, add_special_tokens=False, return_offsets_mapping=True)
    act_ids = list(enc["input_ids"])[: template.action_tokens]
    offsets = list(enc["offset_mapping"])[: len(act_ids)]
    value = np.array(
        [any(s < b + 1 and e > a + 1 for a, b in act.value_spans) for s, e in offsets], dtype=bool
    )
    head, tail = ids("Task:"), ctx + ids("\nAction:") + act_ids
    return EncodedStep(bos + head + task + tail, bos + head + place + tail, len(act_ids), value)


def action_logprobs(lm: LanguageModel, seqs: Sequence[tuple[list[int], int]],
                    chunk: int = 256) -> list[np.ndarray]:
    """log p of each sequence's last ``n`` tokens given what precedes them, in one pass.

    Right-padded with an attention mask; the LM head runs only on the positions that
    predict those tokens (in chunks of ``chunk``), the target logit in float32.
    """
    import torch

    model = lm.model
    n, width = len(seqs), max(len(s) for s, _ in seqs)
    pad = lm.tokenizer.pad_token_id or 0
    ids = torch.full((n, width), pad, dtype=torch.long)
    mask = torch.zeros((n, width), dtype=torch.long)
    rows, pos, targets = [], [], []
    for i, (s, k) in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s)
        mask[i, : len(s)] = 1
        for p in range(len(s) - k, len(s)):
            rows.append(i)
            pos.append(p - 1)
            targets.append(s[p])
    head = model.get_output_embeddings()
    cap = getattr(model.config, "final_logit_softcapping", None)
    with torch.inference_mode():
        hidden = model.model(input_ids=ids, attention_mask=mask, use_cache=False)[0]
        h = hidden[torch.tensor(rows), torch.tensor(pos)]
        tgt = torch.tensor(targets)
        out = []
        for a in range(0, len(rows), chunk):
            hb, tb = h[a : a + chunk], tgt[a : a + chunk]
            logits = head(hb).float()
            picked = (hb.float() * head.weight[tb].float()).sum(-1)
            if cap:
                logits = torch.tanh(logits / cap) * cap
                picked = torch.tanh(picked / cap) * cap
            out.append(picked - torch.logsumexp(logits, -1))
        lp = torch.cat(out).numpy() if out else np.zeros(0, dtype=np.float32)
    res, at = [], 0
    for _, k in seqs:
        res.append(lp[at : at + k].astype(np.float64))
        at += k
    return res


def features_of(lp_task: np.ndarray, lp_masked: np.ndarray, value: np.ndarray) -> np.ndarray:
    """The ``FEATURES`` row of one step from its per-token log-probabilities."""
    g = lp_task - lp_masked
    gv = g[value]
    return np.array([
        g.mean(), g.sum(), len(g), gv.mean() if len(gv) else 0.0, gv.sum(), len(gv),
        g.max(), g.min(), lp_task.mean(), lp_masked.mean(),
    ])


@dataclass
class LikelihoodStats:
    steps: int = 0
    seconds: float = 0.0

    @property
    def steps_per_s(self) -> float:
        return self.steps / self.seconds if self.seconds else 0.0


def likelihood_features(
    lm: LanguageModel,
    steps: Sequence[LikelihoodStep],
    *,
    template: LikelihoodTemplate | None = None,
    batch_size: int = 16,
    progress: bool = False,
    stats: LikelihoodStats | None = None,
) -> np.ndarray:
    """``(len(steps), len(FEATURES))`` raw features; a row of NaN for a step without an action.

    Steps are sorted by length and run ``batch_size`` at a time (both prompts of each in
    the same pass).
    """
    template = template or LikelihoodTemplate()
    out = np.full((len(steps), len(FEATURES)), np.nan)
    enc = {i: encode_step(lm.tokenizer, template, s) for i, s in enumerate(steps)
           if s.action.strip() or (s.tool and s.tool.get("name"))}
    enc = {i: e for i, e in enc.items() if e.n_action}
    order = sorted(enc, key=lambda i: len(enc[i].with_task))
    t0 = time.perf_counter()
    for b in range(0, len(order), batch_size):
        idx = order[b : b + batch_size]
        seqs = [(enc[i].with_task, enc[i].n_action) for i in idx]
        seqs += [(enc[i].masked, enc[i].n_action) for i in idx]
        lps = action_logprobs(lm, seqs)
        for j, i in enumerate(idx):
            out[i] = features_of(lps[j], lps[len(idx) + j], enc[i].value_mask)
        if progress:
            done = min(b + batch_size, len(order))
            rate = done / (time.perf_counter() - t0)
            _stderr(f"likelihood: {done}/{len(order)} steps ({rate:.1f} steps/s)")
    if stats is not None:
        stats.steps += len(order)
        stats.seconds += time.perf_counter() - t0
    return out


@dataclass
class GainCalibration:
    """Standardised, class-balanced logistic regression (:mod:`vigil.fitting`) over a feature
    set → P(harmful); the learned state is plain numbers, so it round-trips as JSON.
    """

    features: tuple[str, ...] = FEATURE_SETS["gain"]
    C: float = 0.1
    mean_: list[float] = field(default_factory=list)
    scale_: list[float] = field(default_factory=list)
    coef_: list[float] = field(default_factory=list)  # on standardised features
    intercept_: float = 0.0

    def columns(self, X: np.ndarray) -> np.ndarray:
        return X[:, [FEATURES.index(f) for f in self.features]]

    def fit(self, X: np.ndarray, y: np.ndarray) -> GainCalibration:
        """``X``: rows of ``FEATURES`` (NaN rows are skipped); ``y``: 0/1 harmful."""
        Z, ok = self.columns(X), ~np.isnan(X).any(1)
        Z, y = Z[ok], np.asarray(y)[ok]
        if len(set(y.tolist())) != 2:
            raise ValueError("the calibration needs harmful and benign steps to fit on")
        fit = fit_standardised_logit(Z, y, self.C)
        self.mean_, self.scale_ = fit.mean.tolist(), fit.scale.tolist()
        self.coef_, self.intercept_ = fit.coef.tolist(), fit.intercept
        return self

    def predict_proba(self, X: np.ndarray) -> np.ndarray:
        """P(harmful) per row; NaN where the row is NaN (no action to score)."""
        if not self.coef_:
            raise ValueError("the calibration is not fitted")
        return StandardisedLogit(
            np.array(self.mean_), np.array(self.scale_), np.array(self.coef_), self.intercept_
        ).predict_proba(self.columns(X))

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["features"] = list(self.features)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> GainCalibration:
        return cls(**{**d, "features": tuple(d["features"])})


def _auroc(y: np.ndarray, s: np.ndarray) -> float | None:
    """:func:`vigil.metrics.auroc` over the steps that have a score (NaN: none)."""
    ok = ~np.isnan(s)
    return auroc(np.asarray(y)[ok], s[ok])


def lodo_scores(
    X: np.ndarray, y: np.ndarray, domains: Sequence[str], calibration: GainCalibration
) -> dict[str, float | None]:
    """AUROC on each training domain of ``calibration`` fitted on the other domains."""
    from dataclasses import replace

    from worldmodel.datasets.domains import lodo_folds

    out: dict[str, float | None] = {}
    for fold in lodo_folds(domains):
        cal = replace(calibration).fit(X[fold.fit], y[fold.fit])
        out[fold.domain] = _auroc(y[fold.held_out], cal.predict_proba(X[fold.held_out]))
    return out


def choose_calibration(
    X: np.ndarray, y: np.ndarray, domains: Sequence[str], *,
    feature_sets: Mapping[str, tuple[str, ...]] | None = None, Cs: Sequence[float] = CS,
) -> tuple[GainCalibration, dict[str, Any]]:
    """The feature set and ``C`` with the best mean LODO AUROC, refitted on everything."""
    grid: dict[str, dict[str, Any]] = {}
    best: tuple[float, str, float] | None = None
    for name, feats in (feature_sets or FEATURE_SETS).items():
        for C in Cs:
            per = lodo_scores(X, y, domains, GainCalibration(feats, C))
            vals = [v for v in per.values() if v is not None]
            mean = float(np.mean(vals)) if vals else float("nan")
            grid[f"{name}@C={C:g}"] = {"mean": mean, "per_domain": per}
            if vals and (best is None or mean > best[0]):
                best = (mean, name, C)
    if best is None:
        raise ValueError("no leave-one-domain-out fold had both harmful and benign steps")
    mean, name, C = best
    sets = feature_sets or FEATURE_SETS
    cal = GainCalibration(sets[name], C).fit(X, y)
    raw = {d: _auroc(y[np.array(domains) == d], -X[np.array(domains) == d, 0])
           for d in sorted(set(domains))}
    figures = {"feature_set": name, "C": C, "lodo_auroc_mean": mean,
               "lodo_auroc": grid[f"{name}@C={C:g}"]["per_domain"],
               "raw_neg_gain_mean_auroc": raw, "grid": grid}
    return cal, figures


def train_likelihood(
    lm: LanguageModel,
    data: str | Path,
    out: str | Path,
    *,
    template: LikelihoodTemplate | None = None,
    limit: int | None = None,
    seed: int = 0,
    batch_size: int = 16,
    log: Log | None = None,
) -> dict[str, Any]:
    """Features of the ``train``/``val`` steps, calibration chosen by LODO, ``bundle.json``.

    ``limit`` takes a deterministic (seeded) subsample of that many steps. Returns the
    bundle's contents.
    """
    from worldmodel.datasets.domains import TRAIN_SPLITS, domain_of
    from worldmodel.datasets.format import read_manifest, read_transitions

    say = log or _stderr
    template = template or LikelihoodTemplate()
    rows = list(read_transitions(data, TRAIN_SPLITS))
    if limit is not None and len(rows) > limit:
        keep = np.sort(np.random.default_rng(seed).choice(len(rows), limit, replace=False))
        rows = [rows[i] for i in keep]
    say(f"likelihood: {len(rows)} train/val steps from {data}")
    stats = LikelihoodStats()
    X = likelihood_features(lm, [LikelihoodStep.from_transition(t) for t in rows],
                            template=template, batch_size=batch_size, progress=log is None,
                            stats=stats)
    y = np.array([int(t.label) for t in rows])
    domains = [domain_of(t) for t in rows]
    ok = ~np.isnan(X).any(1)
    kept = [d for d, k in zip(domains, ok, strict=True) if k]
    cal, figures = choose_calibration(X[ok], y[ok], kept)
    say(f"likelihood: {stats.steps_per_s:.1f} steps/s; chose {figures['feature_set']} "
        f"C={figures['C']:g}; LODO AUROC "
        + ", ".join(f"{d}={v:.3f}" for d, v in figures["lodo_auroc"].items() if v is not None))
    bundle = {
        "version": BUNDLE_VERSION,
        "signal": SIGNAL,
        "model_id": lm.model_id,
        "model_hash": lm.model_hash,
        "dtype": lm.dtype,
        "template": template.to_dict(),
        "template_hash": template.hash,
        "placeholder": PLACEHOLDER,
        "features": list(FEATURES),
        "calibration": cal.to_dict(),
        "lodo": figures,
        "data": {"path": str(data), "content_hash": read_manifest(data).content_hash,
                 "splits": list(TRAIN_SPLITS), "steps": int(ok.sum()),
                 "harmful": int(y[ok].sum()), "limit": limit, "seed": seed},
        "speed": {"steps_per_s": round(stats.steps_per_s, 2), "batch_size": batch_size},
    }
    save_bundle(out, bundle)
    save_features(out, X, y, domains, [t.transition_id for t in rows])
    return bundle


def save_features(out: str | Path, X: np.ndarray, y: np.ndarray, domains: Sequence[str],
                  ids: Sequence[str]) -> Path:
    """``features.json`` beside the bundle: the raw features of every step it was fitted on,
    so a benchmark can refit the calibration (per fold, per feature set) without the model."""
    f = Path(out) / "features.json"
    rows = [[None if np.isnan(v) else round(float(v), 6) for v in r] for r in X]
    f.write_text(json.dumps({"features": list(FEATURES), "rows": rows,
                             "label": [int(v) for v in y], "domain": list(domains),
                             "transition_id": list(ids)}) + "\n")
    return f


def load_features(path: str | Path) -> tuple[np.ndarray, np.ndarray, list[str], list[str]]:
    """``features.json`` of a bundle: ``(X, y, domains, transition ids)``; NaN rows kept."""
    d = json.loads((Path(path) / "features.json").read_text())
    if tuple(d["features"]) != FEATURES:
        raise ValueError(f"{path}: features {d['features']} are not {list(FEATURES)}")
    X = np.array([[np.nan if v is None else v for v in r] for r in d["rows"]], dtype=float)
    return X.reshape(-1, len(FEATURES)), np.array(d["label"]), d["domain"], d["transition_id"]


def save_bundle(out: str | Path, bundle: Mapping[str, Any]) -> Path:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bundle.json").write_text(json.dumps(bundle, indent=2, sort_keys=True) + "\n")
    return out


def load_bundle(path: str | Path) -> tuple[dict[str, Any], LikelihoodTemplate, GainCalibration]:
    """The bundle's contents, its template and its calibration."""
    f = Path(path) / "bundle.json"
    if not f.exists():
        raise FileNotFoundError(
            f"{path}: no likelihood bundle (no bundle.json); build one with "
            "`monitor probes train-likelihood`"
        )
    b = json.loads(f.read_text())
    if b.get("template", {}).get("version") != TEMPLATE_VERSION:
        raise ValueError(f"{f}: template version {b.get('template', {}).get('version')} is not "
                         f"{TEMPLATE_VERSION}; rebuild it with `monitor probes train-likelihood`")
    return b, LikelihoodTemplate(**b["template"]), GainCalibration.from_dict(b["calibration"])
