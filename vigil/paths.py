"""The ``$VIGIL_HOME`` layout: where vigil keeps datasets, model bundles, caches and canaries.

Every path under the home is spelled here and nowhere else::

    $VIGIL_HOME/                  (default ~/.cache/vigil)
        data/agentdojo/           AgentDojo transitions   (monitor worldmodel build-data agentdojo)
        data/miniwob/             MiniWoB++ transitions   (monitor worldmodel build-data miniwob)
        data/toolemu/             ToolEmu transitions     (monitor worldmodel build-data toolemu)
        data/openagentsafety/     OpenAgentSafety transitions
                                  (monitor worldmodel build-data openagentsafety)
        data/stepshield/          StepShield transitions  (monitor worldmodel build-data stepshield)
        data/canaries.jsonl       the default canary set  (built from the training split)
        models/worldmodel/        the L0 world-model bundle
        models/probes/            the L1 probe bundle
        models/policy.json        the calibrated tier policy that joins them
        models/gemma-3-270m-hf/   Gemma-3-270M unpacked from its GGUF on first use
        cache/text/               sentence-encoder cache of the world model
        cache/probes/             activation cache of the probes

Each function reads ``$VIGIL_HOME`` when called, so a test or a CLI flag that sets it
takes effect at once.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

GEMMA_FOLDER = "gemma-3-270m-hf"


def home() -> Path:
    """``$VIGIL_HOME``, or ``~/.cache/vigil`` when it is unset or empty."""
    return Path(os.environ.get("VIGIL_HOME") or Path.home() / ".cache" / "vigil").expanduser()


def data_dir() -> Path:
    return home() / "data"


def dataset(name: str) -> Path:
    """A transition dataset by source name (``agentdojo``, ``miniwob``, ``toolemu``,
    ``openagentsafety``, ``stepshield``)."""
    return data_dir() / name


def canaries() -> Path:
    return data_dir() / "canaries.jsonl"


def models_dir() -> Path:
    return home() / "models"


def bundle(name: str) -> Path:
    """A model bundle by name (``worldmodel``, ``probes``, ``drift``, ...)."""
    return models_dir() / name


def worldmodel_bundle() -> Path:
    return models_dir() / "worldmodel"


def probes_bundle() -> Path:
    return models_dir() / "probes"


def policy() -> Path:
    return models_dir() / "policy.json"


def gemma() -> Path:
    return models_dir() / GEMMA_FOLDER


def text_cache() -> Path:
    return home() / "cache" / "text"


def probe_cache() -> Path:
    return home() / "cache" / "probes"


@contextmanager
def made_once(folder: Path) -> Iterator[None]:
    """Held while ``folder`` is made on first use: a second process making it (a pytest
    worker, a stream worker beside the CLI) waits on ``<folder>.lock``, then finds it made
    and uses it instead of making it beside the first."""
    import fcntl

    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(folder.parent / (folder.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield
