"""Test artefacts built once per test run and shared by the pytest-xdist workers."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from vigil.paths import made_once


def built_once(tmp_path_factory: pytest.TempPathFactory, name: str,
               build: Callable[[Path], None]) -> Path:
    """The folder ``name`` that ``build(folder)`` fills, built once per test run: under
    pytest-xdist the workers share it (the first builds it under a lock; the others wait,
    then read what it built). Tests read it and never write into it."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the run's folder, above each worker's own
    out = root / f"shared-{name}"
    with made_once(out):
        if not (out / ".built").exists():
            shutil.rmtree(out, ignore_errors=True)
            out.mkdir(parents=True)
            build(out)
            (out / ".built").touch()
    return out


def bundle_digests(policy: Path) -> dict[str, str]:
    """SHA-256 of every file of every model bundle a policy file names (a command that only
    re-fits thresholds leaves them byte for byte)."""
    from monitor.policy_files import model_fields

    out = {}
    for mapping, key in model_fields(json.loads(policy.read_text())):
        for f in sorted(Path(mapping[key]).rglob("*")):
            if f.is_file():
                out[str(f)] = hashlib.sha256(f.read_bytes()).hexdigest()
    assert out, f"{policy} names no model files"
    return out
