"""Raw model outputs → calibrated scores, fitted on validation data only.

Surprise is a conformal p-value: the share of benign validation steps whose
prediction error was at least as large, ``p = (1 + #{e_ref ≥ e}) / (n + 1)``;
the score is ``1 − p`` (0.99 means "larger than 99 % of normal steps").
Reference errors are kept per domain (text steps, GUI steps), whose error
scales differ. Harm logits are Platt-scaled into probabilities.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from vigil.metrics import sigmoid, threshold_at_fpr

__all__ = ["Calibration", "fit_calibration", "fit_platt", "threshold_at_fpr"]


def fit_platt(logits: np.ndarray, labels: np.ndarray) -> tuple[float, float]:
    """(a, b) with p = sigmoid(a·logit + b), by logistic regression on one feature."""
    if labels.min() == labels.max():
        return 1.0, 0.0
    from sklearn.linear_model import LogisticRegression

    lr = LogisticRegression(C=100.0).fit(logits.reshape(-1, 1), labels)
    return float(lr.coef_[0, 0]), float(lr.intercept_[0])


@dataclass
class Calibration:
    surprise_ref: dict[str, list[float]] = field(default_factory=dict)  # domain -> sorted errors
    platt_pre: tuple[float, float] = (1.0, 0.0)
    platt_post: tuple[float, float] = (1.0, 0.0)
    harm_threshold_pre: float = 0.5  # probability at 1 % FPR on benign validation steps
    harm_threshold_post: float = 0.5
    fpr: float = 0.01

    def surprise(self, errors: np.ndarray, gui: np.ndarray) -> np.ndarray:
        out = np.zeros(len(errors))
        for domain, sel in (("gui", gui.astype(bool)), ("text", ~gui.astype(bool))):
            ref = np.asarray(self.surprise_ref.get(domain) or self.surprise_ref.get("all", []))
            if not sel.any():
                continue
            if len(ref) == 0:
                out[sel] = 0.5
                continue
            at_least = len(ref) - np.searchsorted(ref, errors[sel], side="left")
            out[sel] = 1.0 - (1.0 + at_least) / (len(ref) + 1.0)
        return out

    def harm_pre(self, logits: np.ndarray) -> np.ndarray:
        a, b = self.platt_pre
        return sigmoid(a * logits + b)

    def harm_post(self, logits: np.ndarray) -> np.ndarray:
        a, b = self.platt_post
        return sigmoid(a * logits + b)

    def to_dict(self) -> dict[str, object]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, object]) -> Calibration:
        d = dict(d)
        d["platt_pre"] = tuple(d["platt_pre"])  # type: ignore[arg-type]
        d["platt_post"] = tuple(d["platt_post"])  # type: ignore[arg-type]
        return cls(**d)  # type: ignore[arg-type]


def fit_calibration(
    *,
    errors: np.ndarray,
    harm_pre: np.ndarray,
    harm_post: np.ndarray,
    labels: np.ndarray,
    normal: np.ndarray,
    gui: np.ndarray,
    fpr: float = 0.01,
) -> Calibration:
    ref = {}
    for domain, sel in (("gui", normal & gui), ("text", normal & ~gui), ("all", normal)):
        if sel.any():
            ref[domain] = sorted(float(e) for e in errors[sel])
    cal = Calibration(
        surprise_ref=ref,
        platt_pre=fit_platt(harm_pre, labels),
        platt_post=fit_platt(harm_post, labels),
        fpr=fpr,
    )
    benign = labels == 0
    cal.harm_threshold_pre = threshold_at_fpr(cal.harm_pre(harm_pre[benign]), fpr)
    cal.harm_threshold_post = threshold_at_fpr(cal.harm_post(harm_post[benign]), fpr)
    return cal
