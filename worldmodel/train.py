"""Training the world model: read datasets, tabulate once, a flat loop, a checkpoint bundle.

Only ``train`` rows are fitted; ``val`` rows choose nothing but the calibration
(surprise reference errors, harm Platt scaling and the 1 %-FPR threshold);
``test*`` rows are never read here.

Tool identity is masked by default (``mask_tools``): the model reads every action with its
function name and argument keys replaced (``features.mask_action``), so the harm heads
cannot learn which tools the training suites use; the bundle records the choice and the
scorer applies it. Rows labelled only as part of their trajectory
(``meta["label_level"] == "trajectory"``, e.g. ToolEmu; StepShield's rogue step with the
unannotated steps after it) are learnt by multiple-instance
learning (``mil``): a batch holds such a trajectory whole, and the harm loss, the relational
harm head and the harm calibration pool its steps (noisy-OR) against its label.

A bundle is a folder: ``model.safetensors`` (weights), ``config.json`` (model and
training config), ``calibration.json``, ``data.json`` (the datasets' manifest
hashes and counts) and ``metrics.json`` (per-epoch progress and the final
validation figures).
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vigil.metrics import auroc, threshold_at_fpr
from worldmodel.calibration import Calibration, fit_calibration, fit_platt
from worldmodel.datasets.format import Transition, read_manifest, read_transitions
from worldmodel.encoders import TextEncoding, text_encoder
from worldmodel.features import Tables, make_batch, step_input, tabulate
from worldmodel.mil import MILLogisticRegression, bag_scores
from worldmodel.model import JEPA, JEPAConfig, ema_update, momentum_at
from worldmodel.relational import InjectionDetector, RelationalHarm, relational_features
from worldmodel.score import save_weights

FIT_SPLITS = ("train", "val")


@dataclass
class TrainConfig:
    data: list[str]
    out: str
    epochs: int = 6
    batch_size: int = 128
    lr: float = 1e-3
    weight_decay: float = 0.05
    seed: int = 0
    max_minutes: float = 10.0
    # dynamics are learnt on normal traffic; harmful/injected rows still train the harm head
    dynamics_on_benign_only: bool = True
    max_train_rows: int | None = None
    threads: int | None = None
    text_cache: str | None = None
    # "minilm" (the transformer) or "static" (model2vec, distilled from it): the bundle
    # scores with the encoder it was trained on
    text_encoder: str = "minilm"
    # actions read without tool names and argument keys (features.mask_action), here and
    # when the bundle scores
    mask_tools: bool = True
    # domains (worldmodel.datasets.domains) left out of the fit: a cross-fitting fold
    # (monitor.crossfit) scores them with a model that never saw their tools
    exclude_domains: tuple[str, ...] = ()
    model: JEPAConfig = field(default_factory=JEPAConfig)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["model"] = self.model.to_dict()
        return d


@dataclass
class Prepared:
    transitions: list[Transition]
    tables: Tables
    labels: np.ndarray
    injected: np.ndarray
    injected_next: np.ndarray
    successor: np.ndarray
    split: np.ndarray
    image_domain: np.ndarray  # True where the step has a screenshot (GUI steps)
    # -1: the step carries its own label; k >= 0: a row of trajectory k, labelled as a whole
    # (``labels`` then holds the trajectory's label, which only the pooled score meets)
    bags: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))


def load_rows(data: list[str], splits: tuple[str, ...]) -> tuple[list[Transition], list[Path]]:
    rows: list[Transition] = []
    bases: list[Path] = []
    for d in data:
        for t in read_transitions(d, splits):
            rows.append(t)
            bases.append(Path(d))
    return rows, bases


def trajectory_bags(transitions: list[Transition]) -> np.ndarray:
    """-1 for a step-labelled transition; for one labelled only through its trajectory
    (``meta["label_level"] == "trajectory"``), the ordinal of its trajectory. A trajectory
    with steps after its first rogue step that nobody annotated (``"after_rogue"``,
    StepShield) has its rogue step and those after it in one bag labelled harmful: one of
    them is (the first), which ones after it are is not known."""
    rogue = {t.trajectory_id for t in transitions if t.meta.get("label_level") == "after_rogue"}
    ids: dict[str, int] = {}
    out = []
    for t in transitions:
        if t.meta.get("label_level") == "trajectory":
            out.append(ids.setdefault(t.trajectory_id, len(ids)))
        elif t.label and t.trajectory_id in rogue:
            out.append(ids.setdefault(t.trajectory_id + "#after-rogue", len(ids)))
        else:
            out.append(-1)
    return np.array(out, dtype=np.int64)


def prepare(
    transitions: list[Transition],
    bases: list[Path],
    encoder: TextEncoding,
    config: JEPAConfig,
    *,
    mask_tools: bool = False,
) -> Prepared:
    """Tabulate transitions (each text encoded once) and link each step to its successor."""
    # screenshots are stored relative to their dataset: make them absolute here
    steps = []
    for t, base in zip(transitions, bases, strict=True):
        s = step_input(t)
        if s.observation.screenshot:
            s = _rebase(s, base)
        steps.append(s)
    tables = tabulate(steps, encoder, config, mask_tools=mask_tools)
    where = {(t.trajectory_id, t.index): i for i, t in enumerate(transitions)}
    successor = np.array(
        [where.get((t.trajectory_id, t.index + 1), -1) for t in transitions], dtype=np.int64
    )
    return Prepared(
        transitions=transitions,
        tables=tables,
        labels=np.array([t.label for t in transitions], dtype=np.int64),
        injected=np.array([t.injected for t in transitions], dtype=np.int64),
        injected_next=np.array([t.next_injected for t in transitions], dtype=np.int64),
        successor=successor,
        split=np.array([t.split for t in transitions]),
        image_domain=np.array([t.observation.screenshot is not None for t in transitions]),
        bags=trajectory_bags(transitions),
    )


def _rebase(s: Any, base: Path) -> Any:
    from dataclasses import replace

    from worldmodel.datasets.format import View

    def fix(v: View | None) -> View | None:
        if v is None or not v.screenshot or Path(v.screenshot).is_absolute():
            return v
        return View(v.text, str(base / v.screenshot))

    return replace(s, observation=fix(s.observation), next_observation=fix(s.next_observation))


@torch.no_grad()
def predict(
    model: JEPA, tables: Tables, rows: np.ndarray, config: JEPAConfig, batch_size: int = 256
) -> dict[str, np.ndarray]:
    """Prediction error and harm logits (pre and post) for ``rows``."""
    model.eval()
    out: dict[str, list[np.ndarray]] = {"error": [], "harm_pre": [], "harm_post": [], "z": []}
    for start in range(0, len(rows), batch_size):
        r = rows[start : start + batch_size]
        o = model(make_batch(tables, r, config))
        out["error"].append(o.error.numpy())
        out["harm_pre"].append(o.harm_pre_logit.numpy())
        out["harm_post"].append(o.harm_post_logit.numpy())
        out["z"].append(o.target.numpy())
    return {k: np.concatenate(v) if v else np.zeros(0) for k, v in out.items()}


def collapse_diagnostics(z: np.ndarray) -> dict[str, float]:
    """Mean per-dimension std and effective rank (exp of singular-value entropy)."""
    if len(z) < 2:
        return {"embedding_std": 0.0, "effective_rank": 0.0}
    zc = z - z.mean(0)
    s = np.linalg.svd(zc, compute_uv=False)
    p = s / max(s.sum(), 1e-12)
    p = p[p > 0]
    return {
        "embedding_std": float(zc.std(0).mean()),
        "effective_rank": float(np.exp(-(p * np.log(p)).sum())),
    }


def train_step(
    model: JEPA, opt: torch.optim.Optimizer, batch: Any, momentum: float
) -> dict[str, float]:
    model.train()
    out = model(batch)
    opt.zero_grad(set_to_none=True)
    out.loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    ema_update(model.target, model.context, momentum)
    return {"loss": float(out.loss.detach()), **out.parts}


def train(cfg: TrainConfig, *, log: Any = None) -> Path:
    """Train, calibrate on val, write the bundle to ``cfg.out``; returns its path."""
    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    t_start = time.monotonic()
    manifests = {d: read_manifest(d) for d in cfg.data}
    for d, m in manifests.items():
        if not any(s in m.counts for s in FIT_SPLITS):
            raise ValueError(f"{d}: has no train or val split to fit on (splits: {list(m.counts)})")
    if not any(m.counts.get("train", {}).get("screenshots", 0) for m in manifests.values()):
        cfg.model.use_images = False  # text-only data: no vision tower to train
    transitions, bases = load_rows(cfg.data, FIT_SPLITS)
    if cfg.exclude_domains:
        from worldmodel.datasets.domains import domain_of

        keep = [i for i, t in enumerate(transitions) if domain_of(t) not in cfg.exclude_domains]
        if len(keep) == len(transitions):
            raise ValueError(f"no transition is in the excluded domains {cfg.exclude_domains}")
        transitions, bases = [transitions[i] for i in keep], [bases[i] for i in keep]
    log(f"loaded {len(transitions)} train/val transitions from {len(cfg.data)} dataset(s)"
        + (f", leaving out {', '.join(cfg.exclude_domains)}" if cfg.exclude_domains else ""))
    encoder = text_encoder(cfg.text_encoder, cache_dir=cfg.text_cache, log=log)
    encoder.progress = log
    t0 = time.monotonic()
    prep = prepare(transitions, bases, encoder, cfg.model, mask_tools=cfg.mask_tools)
    encoder.save()
    log(
        f"encoded {len(prep.tables.text)} distinct texts ({encoder.encoded} new) and "
        f"{len(prep.tables.images)} screenshots in {time.monotonic() - t0:.1f} s"
    )

    train_rows = np.flatnonzero(prep.split == "train")
    val_rows = np.flatnonzero(prep.split == "val")
    units = training_units(train_rows, prep.bags)
    if cfg.max_train_rows and len(train_rows) > cfg.max_train_rows:
        units = subsample_units(units, cfg.max_train_rows, rng)
        train_rows = np.sort(np.concatenate(units))
    dyn_w = np.ones(len(transitions), dtype=np.float32)
    if cfg.dynamics_on_benign_only:  # (a trajectory-labelled row: its trajectory is benign)
        dyn_w[(prep.labels == 1) | (prep.injected_next == 1)] = 0.0

    # class balance over harm examples: a step-labelled row, or a whole labelled trajectory
    unit_y = np.array([prep.labels[u[0]] for u in units])
    pos = max(1, int(unit_y.sum()))
    neg = max(1, len(units) - pos)
    cfg.model.harm_pos_weight = round(min(20.0, neg / pos), 3)
    model = JEPA(cfg.model)
    decay: list[torch.nn.Parameter] = []
    no_decay: list[torch.nn.Parameter] = []
    for name, p in model.named_parameters():
        if p.requires_grad:
            flat = p.ndim < 2 or "norm" in name or name.endswith("pos")
            (no_decay if flat else decay).append(p)
    opt = torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": cfg.weight_decay},
            {"params": no_decay, "weight_decay": 0},
        ],
        lr=cfg.lr,
    )
    # every epoch's batches up front (whole trajectories where labelled as a whole): the
    # schedule needs the total
    plan = [epoch_batches(units, cfg.batch_size, rng) for _ in range(cfg.epochs)]
    steps_per_epoch = len(plan[0]) if plan else 0
    total = sum(len(p) for p in plan)
    n_bags = sum(1 for u in units if prep.bags[u[0]] >= 0)
    sched = torch.optim.lr_scheduler.OneCycleLR(
        opt, max_lr=cfg.lr, total_steps=max(1, total), pct_start=0.1
    )
    log(
        f"training on {len(train_rows)} rows ({n_bags} trajectory-labelled trajectories; "
        f"{pos} harmful examples of {len(units)}), validating on {len(val_rows)}; "
        f"{sum(p.numel() for p in model.parameters() if p.requires_grad):,} parameters, "
        f"{cfg.epochs} epochs x {steps_per_epoch} steps"
    )
    history: list[dict[str, float]] = []
    step = 0
    # the budget is the training loop's: encoding the texts (minutes on a new corpus, cached
    # after) once spent it all, and a bundle was written after less than an epoch
    deadline = time.monotonic() + cfg.max_minutes * 60
    stopped_early = False
    for epoch in range(cfg.epochs):
        sums: dict[str, float] = {}
        t_epoch = time.monotonic()
        done = 0
        for rows in plan[epoch]:
            batch = make_batch(
                prep.tables,
                rows,
                cfg.model,
                labels=prep.labels,
                bags=prep.bags,
                successor=prep.successor,
                dynamics_weight=dyn_w,
            )
            parts = train_step(model, opt, batch, momentum_at(cfg.model, step, total))
            sched.step()
            step += 1
            done += 1
            for k, value in parts.items():
                sums[k] = sums.get(k, 0.0) + value
            if time.monotonic() > deadline:
                stopped_early = True
                break
        n = max(1, done)
        row = {
            "epoch": epoch + 1,
            **{k: total / n for k, total in sums.items()},
            "seconds": time.monotonic() - t_epoch,
        }
        if len(val_rows):
            v = predict(model, prep.tables, val_rows, cfg.model)
            aurocs = harm_aurocs(prep, val_rows, v, cfg.model.mil_pool)
            row.update({f"val_{k}": float("nan") if x is None else x for k, x in aurocs.items()})
            row.update(collapse_diagnostics(v["z"]))
        history.append(row)
        traj = (
            " (trajectories: pre {:.3f} post {:.3f})".format(
                row["val_harm_auroc_trajectory_pre"], row["val_harm_auroc_trajectory_post"]
            )
            if "val_harm_auroc_trajectory_pre" in row
            else ""
        )
        log(
            "epoch {epoch}: loss {loss:.4f} (pred {pred:.4f}, rollout {rollout:.4f}, "
            "var {var:.3f}, harm {harm:.4f}) val AUROC pre {pre:.3f} post {post:.3f}{traj}, "
            "emb std {std:.3f}, {seconds:.0f} s".format(
                traj=traj,
                epoch=row["epoch"],
                loss=row["loss"],
                pred=row["pred"],
                rollout=row["rollout"],
                var=row["var"],
                harm=row["harm"],
                pre=row.get("val_harm_auroc_pre", float("nan")),
                post=row.get("val_harm_auroc_post", float("nan")),
                std=row.get("embedding_std", float("nan")),
                seconds=row["seconds"],
            )
        )
        if stopped_early:
            log(f"stopping: the {cfg.max_minutes:g}-minute budget is spent")
            break

    # calibration on val (benign rows for surprise; all rows for harm scaling)
    cal_rows = val_rows if len(val_rows) else train_rows
    v = predict(model, prep.tables, cal_rows, cfg.model)
    calibration = calibrate(prep, cal_rows, v, cfg.model.mil_pool)
    relational = fit_relational(prep, train_rows, cal_rows, cfg.seed)
    out = Path(cfg.out)
    save_bundle(
        out,
        model,
        cfg,
        calibration,
        manifests,
        {
            "history": history,
            "train_seconds": time.monotonic() - t_start,
            "stopped_early": stopped_early,
            "train_rows": int(len(train_rows)),
            "train_trajectory_labelled": n_bags,
            "val_rows": int(len(val_rows)),
            "seconds_per_epoch": float(np.mean([h["seconds"] for h in history] or [0.0])),
            "relational_val": relational.pop("val"),
            "val": {
                **harm_aurocs(prep, cal_rows, v, cfg.model.mil_pool),
                "surprise_auroc_injected": auroc(prep.injected_next[cal_rows], v["error"]),
                **collapse_diagnostics(v["z"]),
            },
        },
    )
    (out / "relational.json").write_text(json.dumps(relational, sort_keys=True))
    log(f"wrote {out} in {time.monotonic() - t_start:.0f} s")
    return out


def training_units(rows: np.ndarray, bags: np.ndarray) -> list[np.ndarray]:
    """What the harm loss counts as one example: each step-labelled row alone, and each
    trajectory labelled as a whole with all its rows (in ``rows`` order)."""
    units = [np.array([r]) for r in rows if bags[r] < 0]
    inside = rows[bags[rows] >= 0]
    if len(inside):
        order = inside[np.argsort(bags[inside], kind="stable")]
        cuts = np.flatnonzero(np.diff(bags[order])) + 1
        units += np.split(order, cuts)
    return units


def subsample_units(
    units: list[np.ndarray], max_rows: int, rng: np.random.Generator
) -> list[np.ndarray]:
    """Units in a random order until ``max_rows`` rows are taken (a trajectory stays whole)."""
    out, n = [], 0
    for i in rng.permutation(len(units)):
        if n >= max_rows:
            break
        out.append(units[i])
        n += len(units[i])
    return out


def epoch_batches(
    units: list[np.ndarray], batch_size: int, rng: np.random.Generator
) -> list[np.ndarray]:
    """The units in a random order, packed into batches of at most ``batch_size`` rows
    without splitting one (a trajectory longer than a batch is a batch of its own). Units of
    one row each give the batches of a plain row permutation."""
    batches: list[np.ndarray] = []
    cur: list[np.ndarray] = []
    n = 0
    for i in rng.permutation(len(units)):
        u = units[i]
        if cur and n + len(u) > batch_size:
            batches.append(np.concatenate(cur))
            cur, n = [], 0
        cur.append(u)
        n += len(u)
    if cur:
        batches.append(np.concatenate(cur))
    return batches


def harm_aurocs(
    prep: Prepared, rows: np.ndarray, v: dict[str, np.ndarray], pool: str
) -> dict[str, float | None]:
    """Harm AUROC per step over step-labelled ``rows`` and, where some are labelled only as
    trajectories, per trajectory over the pooled score of their steps."""
    in_bag = prep.bags[rows] >= 0
    y = prep.labels[rows]
    out: dict[str, float | None] = {}
    for head in ("pre", "post"):
        out[f"harm_auroc_{head}"] = auroc(y[~in_bag], v[f"harm_{head}"][~in_bag])
        if in_bag.any():
            out[f"harm_auroc_trajectory_{head}"] = _trajectory_auroc(
                v[f"harm_{head}"][in_bag], prep.bags[rows][in_bag], y[in_bag], pool
            )
    return out


def _trajectory_auroc(
    logits: np.ndarray, bags: np.ndarray, labels: np.ndarray, pool: str = "noisy_or"
) -> float | None:
    """AUROC of the pooled step scores of each trajectory against its label."""
    ids, pooled = bag_scores(logits, bags, pool)  # type: ignore[arg-type]
    label = {b: lab for b, lab in zip(bags, labels, strict=True)}
    return auroc(np.array([label[b] for b in ids]), pooled)


def mil_targets(
    labels: np.ndarray, bags: np.ndarray
) -> tuple[np.ndarray, list[int | None], dict[int, int]]:
    """(per-row y with NaN where only the trajectory is labelled, bag ids, bag labels): the
    arguments of ``MILLogisticRegression.fit``."""
    in_bag = bags >= 0
    y = np.where(in_bag, np.nan, labels.astype(np.float64))
    ids = [int(b) if b >= 0 else None for b in bags]
    return y, ids, {int(b): int(lab) for b, lab in zip(bags[in_bag], labels[in_bag], strict=True)}


def calibrate(prep: Prepared, rows: np.ndarray, v: dict[str, np.ndarray], pool: str) -> Calibration:
    """Surprise references (benign rows) and harm Platt scaling + 1 %-FPR thresholds on
    ``rows``. Where some rows are labelled only as trajectories, the Platt map is fitted so
    that the pooled step probabilities meet the trajectory labels (MIL, one feature), and
    the thresholds are read on the known-benign steps (those of step-labelled benign rows
    and of safe trajectories)."""
    labels = prep.labels[rows]
    cal = fit_calibration(
        errors=v["error"],
        harm_pre=v["harm_pre"],
        harm_post=v["harm_post"],
        labels=labels,
        normal=(labels == 0) & (prep.injected_next[rows] == 0),
        gui=prep.image_domain[rows],
    )
    bags = prep.bags[rows]
    if not (bags >= 0).any():
        return cal
    y, ids, bag_labels = mil_targets(labels, bags)
    for head in ("pre", "post"):
        logit = v[f"harm_{head}"].reshape(-1, 1)
        m = MILLogisticRegression(C=100.0, pool=pool, class_weight=None)  # type: ignore[arg-type]
        m.fit(logit, y, ids, bag_labels)
        setattr(cal, f"platt_{head}", (float(m.coef_[0]), m.intercept_))
        benign = getattr(cal, f"harm_{head}")(v[f"harm_{head}"][labels == 0])
        setattr(cal, f"harm_threshold_{head}", threshold_at_fpr(benign, cal.fpr))
    return cal


def fit_relational(
    prep: Prepared, train_rows: np.ndarray, cal_rows: np.ndarray, seed: int
) -> dict[str, Any]:
    """Fit the injection detector and the relational harm model on train; calibrate on val."""
    t = prep.tables
    detector = InjectionDetector(seed=seed).fit(
        t.text, [t.obs_chunks[i] for i in train_rows], prep.injected[train_rows]
    )
    x = relational_features(t, detector)
    y, ids, bag_labels = mil_targets(prep.labels[train_rows], prep.bags[train_rows])
    harm = RelationalHarm().fit(x[train_rows], y, bags=ids, bag_labels=bag_labels)
    p = harm.predict_proba(x[cal_rows])[:, 1]
    y = prep.labels[cal_rows]
    step = prep.bags[cal_rows] < 0
    inj_next = detector.score(t.text, [t.next_chunks[i] for i in cal_rows])
    platt = fit_platt(inj_next, prep.injected_next[cal_rows])
    return {
        "detector": detector.to_dict(),
        "harm": harm.to_dict(),
        "harm_threshold": threshold_at_fpr(p[y == 0], 0.01),
        "injection_platt": list(platt),
        "val": {
            "relational_harm_auroc": auroc(y[step], p[step]),
            **(
                {}
                if step.all()
                else {
                    "relational_harm_auroc_trajectory": _trajectory_auroc(
                        harm.decision_function(x[cal_rows][~step]),
                        prep.bags[cal_rows][~step],
                        y[~step],
                    )
                }
            ),
            "injection_auroc_next": auroc(prep.injected_next[cal_rows], inj_next),
        },
    }


def save_bundle(
    out: Path,
    model: JEPA,
    cfg: TrainConfig,
    calibration: Calibration,
    manifests: dict[str, Any],
    metrics: dict[str, Any],
) -> None:
    out.mkdir(parents=True, exist_ok=True)
    save_weights(model, out)
    (out / "config.json").write_text(json.dumps(cfg.to_dict(), indent=2, sort_keys=True))
    (out / "calibration.json").write_text(json.dumps(calibration.to_dict(), sort_keys=True))
    data = {
        d: {"name": m.name, "hash": m.content_hash, "counts": m.counts}
        for d, m in manifests.items()
    }
    (out / "data.json").write_text(json.dumps(data, indent=2, sort_keys=True))
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2, sort_keys=True, default=float))
