"""The default models shipped with vigil (``make models`` -> ``vigil/shipped/``).

A packed policy is a folder that loads from wherever it is, screens as the policy it was
packed from, and holds nothing that can run code; the shipped one is there, as packed, and
a fresh ``VIGIL_HOME`` screens with it at once, training nothing.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from monitor.pipeline import load_screener
from monitor.shipped import MANIFEST, pack, portable, shipped_dir, verify
from monitor.shipped import _sha256 as _sha
from tests.worker.conftest import ROOT

TRAINED = ("worldmodel", "probes", "provenance", "judge", "judge_fast", "policy.json")


def _steps(small_agentdojo: Path, n: int = 24) -> list:  # type: ignore[type-arg]
    from monitor.calibrate import load_split

    return load_split([small_agentdojo], "val").steps[:n]


def test_a_packed_policy_loads_from_its_own_folder_and_screens_as_packed(
    tiny_policy: Path, small_agentdojo: Path, tmp_path: Path
) -> None:
    out = tmp_path / "packed"
    manifest = pack(tiny_policy, out, log=lambda _m: None)
    assert verify(out) == []
    names = set(manifest["files"])
    assert "policy.json" in names and any(n.startswith("worldmodel/") for n in names)
    assert not [n for n in names if n.endswith((".pt", ".pkl", ".joblib", ".bin"))]
    moved = tmp_path / "elsewhere" / "models"  # the folder travels: its paths are its own
    moved.parent.mkdir()
    out.rename(moved)
    policy = json.loads((moved / "policy.json").read_text())
    assert not any(Path(v).is_absolute() for v in policy["data"]["models"].values())
    steps = _steps(small_agentdojo)
    want = [(v.tier, round(v.score, 6)) for v in
            load_screener(tiny_policy, reviewer=False).screen(steps, through=1)]
    got = [(v.tier, round(v.score, 6)) for v in
           load_screener(moved / "policy.json", reviewer=False).screen(steps, through=1)]
    assert got == want

    # no developer's paths travel: the bundles' records name $VIGIL_HOME or nothing absolute
    for f in moved.rglob("*.json"):
        assert str(tmp_path) not in f.read_text(), f
    assert verify(moved) == []

    (moved / "worldmodel" / "config.json").write_text("{}")
    (moved / "probes" / "probe.pkl").write_bytes(b"\x80\x04N.")
    problems = " ".join(verify(moved))
    assert "worldmodel/config.json: changed" in problems
    assert "probes/probe.pkl: not in the manifest" in problems


def test_a_record_of_an_absolute_path_is_made_portable_and_caught_by_verify(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VIGIL_HOME", str(tmp_path / "home"))
    doc = {"data": [str(tmp_path / "home" / "data" / "agentdojo")],
           str(tmp_path / "home" / "models" / "gemma"): {"cache": "/opt/x/y/cache"},
           "route": "not a path", "note": "/ with spaces is prose"}
    assert portable(doc) == {"data": ["$VIGIL_HOME/data/agentdojo"],
                             "$VIGIL_HOME/models/gemma": {"cache": "<elsewhere>/y/cache"},
                             "route": "not a path", "note": "/ with spaces is prose"}
    folder = tmp_path / "shipped"
    folder.mkdir()
    (folder / "x.json").write_text(json.dumps({"path": "/root/.cache/vigil/models/judge"}))
    (folder / MANIFEST).write_text(json.dumps({"files": {"x.json": {"sha256": _sha(
        folder / "x.json")}}}))
    assert verify(folder) == ["x.json: names an absolute path (/root/.cache/vigil/models/judge)"]


def test_the_shipped_models_are_there_as_packed() -> None:
    folder = shipped_dir()
    assert (folder / MANIFEST).exists(), f"{folder}: no shipped models; build them: make models"
    assert verify(folder) == []
    manifest = json.loads((folder / MANIFEST).read_text())
    assert manifest["metrics"], "the manifest records the policy's metrics"
    assert manifest["data"]["worldmodel"], "... and the hashes of the data it was trained on"


def test_a_fresh_home_screens_with_the_shipped_models_and_trains_nothing(
    small_agentdojo: Path, tmp_path: Path
) -> None:
    assert (shipped_dir() / "policy.json").exists(), "no shipped models: make models"
    home = tmp_path / "home"
    src = tmp_path / "runs.jsonl"
    lines = (small_agentdojo / "trajectories.jsonl").read_text().splitlines()
    src.write_text("\n".join(lines[:3]) + "\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("VIGIL_")}
    gemma = Path.home() / ".cache" / "vigil" / "models" / "gemma-3-270m-hf"
    if gemma.is_dir():  # the unpacked frozen model is not a trained one: share it
        (home / "models").mkdir(parents=True)
        (home / "models" / gemma.name).symlink_to(gemma)
    env.update({"VIGIL_HOME": str(home), "PYTHONPATH": str(ROOT)})
    out = tmp_path / "screened.jsonl"
    run = subprocess.run([sys.executable, "-m", "monitor.cli", "screen", str(src), "--out",
                          str(out)], env=env, cwd=ROOT, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert f"screening with {shipped_dir() / 'policy.json'}" in run.stderr
    assert len(out.read_text().splitlines()) == 3
    made = {p.name for p in (home / "models").iterdir()} if (home / "models").exists() else set()
    assert not made & set(TRAINED), f"trained or calibrated something: {sorted(made)}"
    assert "training" not in run.stderr.lower(), run.stderr[-3000:]
    shutil.rmtree(home, ignore_errors=True)


@pytest.mark.parametrize("bad", ["model.pt", "probe.joblib"])
def test_pack_refuses_a_bundle_that_holds_a_pickle(
    tiny_policy: Path, tmp_path: Path, bad: str
) -> None:
    policy = json.loads(tiny_policy.read_text())
    folder = Path(policy["data"]["models"]["worldmodel"])
    copy = tmp_path / "wm"
    shutil.copytree(folder, copy)
    (copy / bad).write_bytes(b"\x80\x04N.")
    policy["data"]["models"]["worldmodel"] = str(copy)
    p = tmp_path / "policy.json"
    p.write_text(json.dumps(policy))
    with pytest.raises(ValueError, match=bad):
        pack(p, tmp_path / "out", log=lambda _m: None)


@pytest.mark.parametrize("name", ["toolemu", "openagentsafety", "stepshield"])
def test_the_shipped_models_record_the_data_the_builder_makes(tmp_path: Path, name: str
                                                              ) -> None:
    """The transitions of each corpus built from a shared file (seconds each) that the shipped
    world model was trained on are what the builder makes from the shared data today
    (AgentDojo's full build takes minutes: its builds are shown identical across processes in
    tests/worldmodel/test_agentdojo_data.py)."""
    import importlib

    module = importlib.import_module(f"worldmodel.datasets.{name}.build")
    if not module.default_source().exists():
        pytest.skip(f"no {name} file at {module.default_source()}")
    manifest = json.loads((shipped_dir() / MANIFEST).read_text())
    built = getattr(module, f"build_{name}")(tmp_path / name, progress=False)
    assert manifest["data"]["worldmodel"][name] == built.content_hash, (
        f"the shipped models were trained on other {name} data than the builder makes now: "
        "rebuild them with `make models`")
