"""The L0 scorer: a checkpoint bundle → surprise and harm for a batch of steps.

    scorer = WorldModelScorer.load(vigil.paths.worldmodel_bundle())
    scores = scorer.score(steps)      # steps: list[StepInput]

Before an action runs (``next_observation`` is None) only ``harm_pre`` is
known; after, ``surprise`` and ``harm_post`` too. Texts are encoded through
the cached encoder, so repeated observations cost nothing. Actions are read as the
bundle was trained to read them: with tool names and argument keys masked where its
``config.json`` says ``mask_tools`` (a bundle from before the option: unmasked).

The weights are ``model.safetensors``: a bundle travels between machines, so nothing in it
can run code when loaded. A bundle from before (pickled ``model.pt``) is refused: retrain it
with ``monitor worldmodel train``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from worldmodel.calibration import Calibration
from worldmodel.encoders import TextEncoding, text_encoder
from worldmodel.features import StepInput, make_batch, tabulate
from worldmodel.model import JEPA, JEPAConfig
from worldmodel.relational import InjectionDetector, RelationalHarm, relational_features

WEIGHTS_FILE = "model.safetensors"
BUNDLE_FILES = (WEIGHTS_FILE, "config.json", "calibration.json", "data.json")
_PICKLED_WEIGHTS = "model.pt"  # what bundles held before safetensors


@dataclass(frozen=True)
class WorldModelScore:
    harm_pre: float  # calibrated probability, from the predicted next latent
    harm_post: float | None  # calibrated probability, from the observed next latent
    surprise: float | None  # 1 − conformal p-value of the prediction error
    error: float | None  # raw latent prediction error
    relational_harm: float | None = None  # tool-agnostic harm probability (relational.py)
    injection: float | None = None  # probability the observed result carries injected text

    @property
    def harm(self) -> float:
        return self.harm_post if self.harm_post is not None else self.harm_pre

    def signals(self) -> dict[str, float]:
        out = {"wm_harm_pre": self.harm_pre}
        if self.harm_post is not None:
            out["wm_harm_post"] = self.harm_post
        if self.surprise is not None:
            out["wm_surprise"] = self.surprise
        if self.relational_harm is not None:
            out["wm_relational_harm"] = self.relational_harm
        if self.injection is not None:
            out["wm_injection"] = self.injection
        return out


def check_bundle(path: Path) -> None:
    if not (path / WEIGHTS_FILE).exists() and (path / _PICKLED_WEIGHTS).exists():
        raise ValueError(
            f"{path / _PICKLED_WEIGHTS}: pickled weights from before the safetensors bundle "
            "format, which are never loaded (unpickling can run code); retrain the bundle with "
            "`monitor worldmodel train`"
        )
    missing = [f for f in BUNDLE_FILES if not (path / f).exists()]
    if missing:
        raise FileNotFoundError(
            f"{path}: not a world-model bundle (missing {', '.join(missing)}); "
            "train one with `monitor worldmodel train`"
        )


def save_weights(model: JEPA, out: Path) -> Path:
    """Write ``model``'s weights into the bundle folder ``out`` (and drop a stale ``model.pt``)."""
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(out / WEIGHTS_FILE))
    (out / _PICKLED_WEIGHTS).unlink(missing_ok=True)
    return out / WEIGHTS_FILE


def load_weights(model: JEPA, path: Path) -> JEPA:
    """``model`` with the weights of the bundle at ``path`` (every one of them, exactly)."""
    model.load_state_dict(load_file(str(path / WEIGHTS_FILE), device="cpu"), strict=True)
    return model


def _text_cache(trained_with: str | None) -> Path | None:
    """The text cache the bundle was trained with, where it exists on this machine; else
    this machine's (a bundle from elsewhere, a shipped one: never a folder of its build's)."""
    if trained_with and Path(trained_with).is_dir():
        return Path(trained_with)
    import vigil.paths

    return vigil.paths.text_cache() if trained_with else None


class WorldModelScorer:
    def __init__(
        self,
        model: JEPA,
        calibration: Calibration,
        encoder: TextEncoding,
        *,
        batch_size: int = 64,
        image_base: Path | None = None,
        data_hash: dict[str, str] | None = None,
        relational: dict[str, Any] | None = None,
        mask_tools: bool = False,
        text_encoder_kind: str = "minilm",
    ) -> None:
        self.model = model.eval()
        self.text_encoder_kind = text_encoder_kind  # what the bundle was trained to read
        self.config: JEPAConfig = model.config
        self.calibration = calibration
        self.encoder = encoder
        self.batch_size = batch_size
        self.image_base = image_base
        self.mask_tools = mask_tools
        self.data_hash = data_hash or {}
        self.detector = self.relational_harm = None
        self.relational = relational
        if relational:
            self.detector = InjectionDetector.from_dict(relational["detector"])
            self.relational_harm = RelationalHarm.from_dict(relational["harm"])

    @classmethod
    def load(
        cls, path: str | Path, *, encoder: TextEncoding | None = None, batch_size: int = 64
    ) -> WorldModelScorer:
        path = Path(path).expanduser()
        check_bundle(path)
        cfg = json.loads((path / "config.json").read_text())
        model = load_weights(JEPA(JEPAConfig.from_dict(cfg["model"])), path)
        calibration = Calibration.from_dict(json.loads((path / "calibration.json").read_text()))
        data = json.loads((path / "data.json").read_text())
        rel_file = path / "relational.json"
        return cls(
            model,
            calibration,
            encoder or text_encoder(cfg.get("text_encoder", "minilm"),
                                    cache_dir=_text_cache(cfg.get("text_cache"))),
            batch_size=batch_size,
            data_hash={d: v["hash"] for d, v in data.items()},
            relational=json.loads(rel_file.read_text()) if rel_file.exists() else None,
            mask_tools=bool(cfg.get("mask_tools", False)),
            text_encoder_kind=str(cfg.get("text_encoder", "minilm")),
        )

    @torch.no_grad()
    def score(self, steps: Sequence[StepInput]) -> list[WorldModelScore]:
        if not steps:
            return []
        tables = tabulate(
            steps, self.encoder, self.config, image_base=self.image_base, mask_tools=self.mask_tools
        )
        observed = tables.nxt >= 0
        gui = tables.obs_img[:, -1] >= 0
        errors, pre, post = [], [], []
        rows = np.arange(len(steps))
        for start in range(0, len(rows), self.batch_size):
            r = rows[start : start + self.batch_size]
            out = self.model(make_batch(tables, r, self.config))
            errors.append(out.error.numpy())
            pre.append(out.harm_pre_logit.numpy())
            post.append(out.harm_post_logit.numpy())
        err = np.concatenate(errors)
        cal = self.calibration
        harm_pre = cal.harm_pre(np.concatenate(pre))
        harm_post = cal.harm_post(np.concatenate(post))
        surprise = cal.surprise(err, gui)
        rel_harm = injection = None
        if self.detector is not None and self.relational_harm is not None and self.relational:
            x = relational_features(tables, self.detector)
            rel_harm = self.relational_harm.predict_proba(x)[:, 1]
            a, b = self.relational["injection_platt"]
            logit = self.detector.score(tables.text, tables.next_chunks)
            injection = 1.0 / (1.0 + np.exp(-np.clip(a * logit + b, -50, 50)))
        return [
            WorldModelScore(
                harm_pre=float(harm_pre[i]),
                harm_post=float(harm_post[i]) if observed[i] else None,
                surprise=float(surprise[i]) if observed[i] else None,
                error=float(err[i]) if observed[i] else None,
                relational_harm=None if rel_harm is None else float(rel_harm[i]),
                injection=None if injection is None or not observed[i] else float(injection[i]),
            )
            for i in range(len(steps))
        ]
