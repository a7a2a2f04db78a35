"""The default models shipped with vigil: a calibrated policy and its bundles, in one folder.

``make models`` builds the full defaults with the same CLI a user runs (``monitor calibrate
--defaults`` in a fresh ``VIGIL_HOME``: the recipes the benches measure) and packs them
with :func:`pack` into ``vigil/shipped/``, which the package carries. First use loads them
(``ensure_policy`` prefers, in order: ``--policy``, ``$VIGIL_HOME/models/policy.json``, the
shipped policy, and only then builds the defaults), so a fresh install screens at once, with
no training.

The folder::

    vigil/shipped/
      policy.json      the calibrated policy; its model paths are relative to this folder
      worldmodel/      the L0 world-model bundle (model.safetensors + JSON)
      probes/          the L1 probe bundle (probe.safetensors + JSON)
      provenance/      the provenance bundle (JSON)
      judge/           the L2 judge, when the policy has one: a fully fine-tuned judge as int4
                       deltas of its changed blocks (monitor.reviewer.pack), a LoRA adapter as
                       it is (safetensors + JSON)
      manifest.json    code version, data hashes, metrics, and the SHA-256 of every file

Nothing in it can run code when loaded (JSON and safetensors only): :func:`verify` checks
every file against the manifest, and refuses a pickle. The frozen encoders (MiniLM,
Gemma-3-270M) are not copied: they come from the pinned model packages.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from monitor.policy_files import model_fields

MANIFEST = "manifest.json"
MANIFEST_VERSION = 1
# what a shipped folder may hold: formats that cannot run code when loaded
SAFE_SUFFIXES = (".json", ".safetensors", ".txt", ".md", ".model", ".jinja")
SKIP_SUFFIXES = (".png",)  # reports that come with a bundle, not needed to load it


def shipped_dir() -> Path:
    """``vigil/shipped/`` of the installed package."""
    import vigil

    return Path(vigil.__file__).resolve().parent / "shipped"


def _sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _code_version() -> str:
    root = Path(__file__).resolve().parent.parent
    try:
        out = subprocess.run(["git", "-C", str(root), "describe", "--always", "--dirty"],
                             capture_output=True, text=True, timeout=10, check=True)
        return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _local(recorded: str) -> Path:
    """A dataset path as a bundle records it (``$VIGIL_HOME/...`` once packed) on this
    machine: re-packing a shipped folder reads the same datasets under ``$VIGIL_HOME``."""
    import vigil.paths

    if recorded.startswith("$VIGIL_HOME/"):
        return vigil.paths.home() / recorded.removeprefix("$VIGIL_HOME/")
    return Path(recorded)


def _text_files(dataset: Path) -> dict[str, str]:
    """SHA-256 of each JSON Lines file of a dataset, from its manifest ({} without one)."""
    f = dataset / "manifest.json"
    if not f.exists():
        return {}
    files = json.loads(f.read_text()).get("files", {})
    return {name: sha for name, sha in sorted(files.items()) if name.endswith(".jsonl")}


def _is_full_judge(folder: Path) -> bool:
    f = folder / "judge.json"
    if not f.exists():
        return False
    info = json.loads(f.read_text())
    return info.get("method") == "full" and "packed" not in info


def _portable_path(value: str) -> str:
    """An absolute path as a record that holds on any machine: under ``$VIGIL_HOME`` as
    ``$VIGIL_HOME/...``, beside the checkout as ``../...`` (the checkout's parent, where
    ``shared/`` is), elsewhere as ``<elsewhere>/`` and its last two parts."""
    import vigil.paths

    p = Path(value)
    for base, shown in ((vigil.paths.home().resolve(), "$VIGIL_HOME"),
                        (Path(__file__).resolve().parents[2], "..")):
        if p.is_relative_to(base):
            return f"{shown}/{p.relative_to(base).as_posix()}".rstrip("/")
    return "<elsewhere>/" + "/".join(p.parts[-2:])


def _is_absolute_path(value: str) -> bool:
    return value.startswith("/") and len(value) > 1 and "\n" not in value and " " not in value


def portable(value: Any) -> Any:
    """``value`` (a JSON document) with every absolute path in its strings and keys made a
    portable record (:func:`_portable_path`): a shipped folder names no developer's paths."""
    if isinstance(value, dict):
        return {portable(k): portable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [portable(v) for v in value]
    if isinstance(value, str) and _is_absolute_path(value):
        return _portable_path(value)
    return value


def _absolute_paths(value: Any) -> list[str]:
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in _absolute_paths(k) + _absolute_paths(v)]
    if isinstance(value, list):
        return [p for v in value for p in _absolute_paths(v)]
    return [value] if isinstance(value, str) and _is_absolute_path(value) else []


def pack(policy_path: Path, out: Path, *, log: Any = print) -> dict[str, Any]:
    """Copy a calibrated policy and every bundle it names into ``out`` (replaced), with the
    policy's model paths made relative, and write the manifest; returns the manifest."""
    policy = json.loads(policy_path.read_text())
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    copied: dict[str, str] = {}  # source folder -> name in out
    for mapping, key in model_fields(policy):
        src = Path(mapping[key]).expanduser()
        if not src.is_dir():
            raise FileNotFoundError(f"{policy_path}: names {key} = {src}, which is not a folder")
        if str(src) not in copied:
            name = {"model_path": "judge"}.get(key, key)  # by role: worldmodel, probes, ...
            if name in copied.values():
                name = f"{name}-{len(copied)}"
            if _is_full_judge(src):  # a 1.1 GB model folder: its changed blocks, as deltas
                from monitor.reviewer.pack import pack_judge
                from monitor.reviewer.train import packed_verdict_diff

                pack_judge(src, tmp / name, check=packed_verdict_diff, log=log)
            else:
                shutil.copytree(src, tmp / name, ignore=shutil.ignore_patterns(
                    *(f"*{s}" for s in SKIP_SUFFIXES)))
            copied[str(src)] = name
            log(f"vigil: packed {src} -> {out / name}")
        mapping[key] = copied[str(src)]
    (tmp / "policy.json").write_text(json.dumps(policy, indent=2, sort_keys=True) + "\n")
    wm = next((tmp / n for n in copied.values() if (tmp / n / "data.json").exists()), None)
    data = {"policy_fit": {k: v for k, v in policy.get("data", {}).items()
                           if k in ("train", "val")}}
    if wm is not None:
        used = json.loads((wm / "data.json").read_text())
        data["worldmodel"] = {Path(d).name: v["hash"] for d, v in used.items()}  # by name
        # the text files' own hashes: MiniWoB++ screenshots can differ by a pixel between
        # two recordings (a caret's blink), which changes a dataset's content hash
        data["worldmodel_text"] = {Path(d).name: _text_files(_local(d)) for d in used}
    for f in sorted(tmp.rglob("*.json")):  # records of where things were built: made portable
        f.write_text(json.dumps(portable(json.loads(f.read_text())), indent=2, sort_keys=True)
                     + "\n")
    files: dict[str, dict[str, Any]] = {}
    for f in sorted(p for p in tmp.rglob("*") if p.is_file()):
        rel = f.relative_to(tmp).as_posix()
        if not rel.endswith(SAFE_SUFFIXES):
            raise ValueError(f"{rel}: a shipped folder holds only {', '.join(SAFE_SUFFIXES)} "
                             "files (nothing that can run code when loaded)")
        files[rel] = {"sha256": _sha256(f), "bytes": f.stat().st_size}
    manifest = {
        "version": MANIFEST_VERSION,
        "code_version": _code_version(),
        "built": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "data": data,
        "metrics": policy.get("metrics", {}),
        "files": files,
        "bytes": sum(v["bytes"] for v in files.values()),
    }
    (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return manifest


def verify(folder: Path) -> list[str]:
    """What is wrong with a shipped folder (empty: every file is there, as the manifest
    recorded it, and nothing else that could run code is)."""
    m = folder / MANIFEST
    if not m.exists():
        return [f"{folder}: no {MANIFEST}"]
    manifest = json.loads(m.read_text())
    problems = []
    for rel, info in manifest["files"].items():
        f = folder / rel
        if not f.exists():
            problems.append(f"{rel}: missing")
        elif _sha256(f) != info["sha256"]:
            problems.append(f"{rel}: changed since it was packed (SHA-256 differs)")
    for f in folder.rglob("*"):
        rel = f.relative_to(folder).as_posix()
        if f.is_file() and rel != MANIFEST and rel not in manifest["files"]:
            problems.append(f"{rel}: not in the manifest")
        if f.is_file() and f.suffix == ".json":
            found = _absolute_paths(json.loads(f.read_text()))
            if found:
                problems.append(f"{rel}: names an absolute path ({found[0]})")
    return problems


def shipped_policy() -> Path | None:
    """The shipped policy, when the package carries one."""
    p = shipped_dir() / "policy.json"
    return p if p.exists() and (shipped_dir() / MANIFEST).exists() else None


# How far a retraining of the shipped defaults may land from the recorded metrics (absolute):
# the budgets' shares of benign steps, the recall at each tier and the trajectory AUROC.
# Training is seeded, but thread counts and bfloat16 sums differ between machines.
TOLERANCE: dict[str, float] = {
    "val.benign_share_reaching_L1": 0.03,
    "val.benign_share_reaching_L2": 0.01,
    "val.benign_share_reaching_L3": 0.005,
    "val.recall_L1": 0.05,
    "val.recall_L2": 0.15,
    "val.recall_L3": 0.15,
    "trajectory.auroc": 0.01,
    "trajectory.recall_flagged": 0.05,
}


def metric_differences(recorded: dict[str, Any], got: dict[str, Any],
                       tolerance: dict[str, float] | None = None) -> list[str]:
    """Each metric of :data:`TOLERANCE` that ``got`` (a policy's ``metrics``) has more than
    its tolerance away from ``recorded`` (the manifest's), one line each; [] when it agrees."""
    out = []
    for key, tol in (tolerance or TOLERANCE).items():
        section, name = key.split(".", 1)
        a, b = recorded.get(section, {}).get(name), got.get(section, {}).get(name)
        if a is None or b is None:
            out.append(f"{key}: recorded {a}, got {b}")
        elif abs(float(a) - float(b)) > tol:
            out.append(f"{key}: recorded {float(a):.4f}, got {float(b):.4f} (tolerance {tol})")
    return out
