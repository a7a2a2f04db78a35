"""The local probe model: a :class:`vigil.lm.LanguageModel` as an activation source.

:class:`ProbeModel` adds to the loaded language model what :func:`probes.capture.extract`
reads from an :class:`~probes.capture.ActivationSource`: the layers and poolings a
probe can read, the activation-cache key, and the capture of one batch. Loading
(folders, provenance, dtype, offline rules) is :func:`vigil.lm.load_language_model`'s.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np

from probes.capture import ProbeStep, Template, capture_batch
from vigil.lm import LanguageModel, load_language_model


@dataclass(frozen=True)
class ProbeModel(LanguageModel):
    """A loaded causal LM that :func:`probes.capture.extract` reads activations from."""

    @classmethod
    def of(cls, lm: LanguageModel) -> ProbeModel:
        """The same loaded model, as a probe model."""
        return cls(**{f.name: getattr(lm, f.name) for f in fields(lm)})

    @property
    def poolings(self) -> tuple[str, ...]:
        return ("last", "mean")

    @property
    def source(self) -> str:
        return "model"

    @property
    def available_layers(self) -> list[int]:
        """Layers a probe can read: the output of decoder block 1..num_layers."""
        return list(range(1, self.num_layers + 1))

    @property
    def cache_key(self) -> str:
        """Activation-cache identity: the weights, and the dtype they ran in."""
        return self.model_hash if self.dtype == "float32" else f"{self.model_hash}-{self.dtype}"

    def capture_batch(
        self, template: Template, steps: Sequence[ProbeStep], layers: Sequence[int]
    ) -> dict[tuple[int, str], np.ndarray]:
        return capture_batch(self, template, steps, layers)


def load_probe_model(
    path: str | Path | None = None,
    *,
    threads: int | None = None,
    dtype: str | None = "auto",
    compile: bool = False,
    log: Callable[[str], None] | None = None,
) -> ProbeModel:
    """A local HF causal LM folder as a probe model (default: Gemma-3-270M).

    The arguments are :func:`vigil.lm.load_language_model`'s; the model runs with
    the attention transformers chooses (SDPA), right for the probes' short inputs.
    """
    return ProbeModel.of(
        load_language_model(path, threads=threads, dtype=dtype, compile=compile, log=log)
    )
