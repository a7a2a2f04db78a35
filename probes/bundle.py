"""Probe bundles: what L1 loads, and :class:`ProbeScorer`, which scores steps with one.

A bundle is a folder::

    BUNDLE/
      bundle.json        layer, pooling, template, model id and hash, threshold, metrics, sweep
      probe.json         per estimator (``probe``, and ``baseline`` when there is one): its
                         class, hyper-parameters, classes and scalars
      probe.safetensors  the estimators' learned arrays, named ``<probe|baseline>.<name>``

``probe`` is the fitted probe, ``baseline`` the difference-of-means baseline on the same
layer. Bundles travel between machines, so nothing in one can run code when it is loaded:
JSON and safetensors only. A folder from before version 2 (pickled ``probe.joblib``) is
refused, never unpickled: retrain it with ``monitor probes train``.

The score of a step is the probe's probability of harm; ``threshold`` (set on
benign validation steps at ``target_fpr``) turns it into a flag.

``source`` says where a bundle's activations come from: ``"model"`` (a local
HF causal LM, ``model_path``), ``"endpoint"`` (an OpenAI-compatible
``/embeddings`` endpoint, ``model_path`` is its base URL, ``model_id`` the
served model name) or ``"records"`` (activations attached to the records
themselves, ``meta.activations``; there is no probe model to fall back on).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import load_file, save_file

from probes.capture import ActivationSource, ExtractStats, ProbeStep, Template, extract
from probes.estimators import DiffMeansProbe, LogisticProbe
from probes.models import load_probe_model

BUNDLE_VERSION = 2
ESTIMATORS_FILE = "probe.json"
ARRAYS_FILE = "probe.safetensors"
# what a bundle may name as an estimator: nothing else is ever built from one
ESTIMATORS: dict[str, type[LogisticProbe] | type[DiffMeansProbe]] = {
    c.__name__: c for c in (LogisticProbe, DiffMeansProbe)
}
_PICKLED = ("probe.joblib", "baseline.joblib")  # the version-1 files


@dataclass
class BundleInfo:
    layer: int
    pooling: str
    template: dict[str, int]
    template_hash: str
    model_id: str
    model_hash: str
    model_path: str
    threshold: float
    target_fpr: float
    estimator: str
    metrics: dict[str, Any] = field(default_factory=dict)
    sweep: dict[str, Any] = field(default_factory=dict)
    data: dict[str, Any] = field(default_factory=dict)
    version: int = BUNDLE_VERSION
    source: str = "model"  # "model" | "endpoint" | "records"
    dtype: str = "float32"  # what the probe model ran in when the bundle was trained


def save_bundle(out: str | Path, info: BundleInfo, probe: Any, baseline: Any | None = None) -> Path:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    values: dict[str, Any] = {}
    arrays: dict[str, np.ndarray] = {}
    for role, est in (("probe", probe), ("baseline", baseline)):
        if est is None:
            continue
        if ESTIMATORS.get(type(est).__name__) is not type(est):
            raise TypeError(
                f"{role}: a bundle holds one of {sorted(ESTIMATORS)}, not {type(est).__name__}"
            )
        v, a = est.to_arrays()
        values[role] = {"estimator": type(est).__name__, **v}
        arrays.update({f"{role}.{k}": np.ascontiguousarray(x) for k, x in a.items()})
    save_file(arrays, str(out / ARRAYS_FILE))
    (out / ESTIMATORS_FILE).write_text(json.dumps(values, indent=2, sort_keys=True) + "\n")
    for name in _PICKLED:  # a retrained version-1 folder keeps no pickle
        (out / name).unlink(missing_ok=True)
    (out / "bundle.json").write_text(json.dumps(asdict(info), indent=2, sort_keys=True) + "\n")
    return out


def load_bundle(path: str | Path) -> tuple[BundleInfo, Any, Any | None]:
    """The bundle's info, probe and baseline (``None`` when it has none)."""
    path = Path(path)
    if not (path / "bundle.json").exists():
        raise FileNotFoundError(
            f"{path}: not a probe bundle (no bundle.json); train one with `monitor probes train`"
        )
    if not (path / ARRAYS_FILE).exists():
        if (path / _PICKLED[0]).exists():
            raise ValueError(
                f"{path / _PICKLED[0]}: a pickled probe from before bundle version "
                f"{BUNDLE_VERSION}, which is never loaded (unpickling can run code); retrain "
                "the bundle with `monitor probes train`"
            )
        raise FileNotFoundError(
            f"{path}: not a probe bundle (no {ARRAYS_FILE}); train one with `monitor probes train`"
        )
    info = BundleInfo(**json.loads((path / "bundle.json").read_text()))
    values = json.loads((path / ESTIMATORS_FILE).read_text())
    arrays = load_file(str(path / ARRAYS_FILE))
    ests: dict[str, Any] = {}
    for role, v in values.items():
        if v["estimator"] not in ESTIMATORS:
            raise ValueError(f"{path / ESTIMATORS_FILE}: unknown estimator {v['estimator']!r}")
        prefix = f"{role}."
        mine = {k[len(prefix):]: a for k, a in arrays.items() if k.startswith(prefix)}
        ests[role] = ESTIMATORS[v["estimator"]].from_arrays(v, mine)
    return info, ests["probe"], ests.get("baseline")


class ProbeScorer:
    """Steps → calibrated probabilities of harm, with the bundle's probe.

    A step carrying activations from the bundle's own model (same model id and
    pooling, with the bundle's layer) is scored from them directly; the others
    go through the bundle's activation source (loaded on first need), with the
    activation cache: the local probe model (``model``/``model_path``), or the
    embeddings endpoint (``endpoint``, else ``$VIGIL_PROBES_ENDPOINT``, else the
    URL the bundle was trained against). A ``"records"`` bundle has no source:
    a step without the right activations is an error.
    """

    def __init__(
        self,
        info: BundleInfo,
        probe: Any,
        baseline: Any | None = None,
        *,
        model: ActivationSource | None = None,
        model_path: str | Path | None = None,
        endpoint: str | None = None,
        api_key_env: str | None = None,
        cache_dir: str | Path | None = None,
        batch_size: int = 16,
    ) -> None:
        self.info = info
        self.probe = probe
        self.baseline = baseline
        self.model = model
        self.model_path = model_path
        self.endpoint = endpoint
        self.api_key_env = api_key_env
        self.cache_dir = cache_dir
        self.batch_size = batch_size
        self.template = Template(**info.template)
        self.stats = ExtractStats()

    @classmethod
    def load(cls, path: str | Path, **kwargs: Any) -> ProbeScorer:
        info, probe, baseline = load_bundle(path)
        return cls(info, probe, baseline, **kwargs)

    @property
    def threshold(self) -> float:
        return self.info.threshold

    def _probe_model(self, first_missing: ProbeStep) -> ActivationSource:
        info = self.info
        if self.model is None:
            if info.source == "records":
                raise ValueError(
                    f"step {first_missing.step_id or '?'} carries no activations of "
                    f"{info.model_id} (layer {info.layer}, pooling {info.pooling}), and this "
                    "bundle was trained on record-attached activations, so it has no probe "
                    "model to compute them"
                )
            if info.source == "endpoint":
                from probes.remote import API_KEY_ENV, connect_endpoint

                self.model = connect_endpoint(
                    self.endpoint,
                    info.model_id,
                    default_url=info.model_path,
                    api_key_env=self.api_key_env or API_KEY_ENV,
                )
            else:
                path = self.model_path or (info.model_path or None)
                if path and not Path(path).exists():
                    path = None  # the bundle came from another machine: use the default model
                self.model = load_probe_model(path, dtype=info.dtype, keep_layers=info.layer)
        if self.model.model_hash != info.model_hash:
            raise ValueError(
                f"probe model {self.model.model_id} ({self.model.model_hash}) is not the "
                f"bundle's {info.model_id} ({info.model_hash})"
            )
        return self.model

    def _attached(self, step: ProbeStep) -> Sequence[float] | None:
        if (
            step.activations is not None
            and step.activations_model == self.info.model_id
            and (step.activations_pooling or self.info.pooling) == self.info.pooling
        ):
            return step.activations.get(self.info.layer)
        return None

    def features(self, steps: Sequence[ProbeStep], *, progress: bool = False) -> np.ndarray:
        """The bundle's (layer, pooling) activations for ``steps``."""
        rows: list[np.ndarray | None] = []
        for s in steps:
            a = self._attached(s)
            rows.append(None if a is None else np.asarray(a, dtype=np.float32))
        todo = [i for i, r in enumerate(rows) if r is None]
        if todo:
            got = extract(
                self._probe_model(steps[todo[0]]),
                [steps[i] for i in todo],
                [self.info.layer],
                template=self.template,
                cache_dir=self.cache_dir,
                batch_size=self.batch_size,
                progress=progress,
                stats=self.stats,
            )[(self.info.layer, self.info.pooling)]
            for j, i in enumerate(todo):
                rows[i] = got[j]
        width = self.probe.n_features_in_
        for s, r in zip(steps, rows, strict=True):
            if r is not None and r.shape != (width,):
                raise ValueError(
                    f"step {s.step_id or '?'}: activations have shape {r.shape}, the bundle's "
                    f"probe reads {width} features"
                )
        return np.stack([r for r in rows if r is not None]) if rows else np.empty((0, 0))

    def score_features(self, X: np.ndarray, *, baseline: bool = False) -> np.ndarray:
        est = self.baseline if baseline else self.probe
        if est is None:
            raise ValueError("this bundle has no difference-of-means baseline")
        return np.asarray(est.predict_proba(X)[:, 1])

    def score(self, steps: Sequence[ProbeStep], *, progress: bool = False) -> np.ndarray:
        """Probability of harm for each step."""
        if not steps:
            return np.empty(0)
        return self.score_features(self.features(steps, progress=progress))

    def flag(self, steps: Sequence[ProbeStep]) -> np.ndarray:
        """Whether each step reaches the bundle's calibrated threshold (escalate to L2)."""
        return self.score(steps) >= self.threshold
