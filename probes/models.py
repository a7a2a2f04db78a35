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
from typing import Any

import numpy as np

from probes.capture import ProbeStep, Template, capture_batch
from vigil.lm import LanguageModel, decoder_layers, load_language_model


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
    keep_layers: int | None = None,
) -> ProbeModel:
    """A local HF causal LM folder as a probe model (default: Gemma-3-270M).

    The arguments are :func:`vigil.lm.load_language_model`'s; the model runs with
    the attention transformers chooses (SDPA), right for the probes' short inputs.
    ``keep_layers=N``: only the first N decoder blocks are kept (a scorer reading layer N
    never runs the others; for Gemma-3-270M's layer 6, 134 MB less resident). The
    activations of those layers are the full model's, so the cache key is unchanged.
    """
    lm = load_language_model(path, threads=threads, dtype=dtype, compile=compile, log=log)
    if keep_layers is not None:
        keep_first_layers(lm.model, keep_layers)
    return ProbeModel.of(lm)


def keep_first_layers(model: Any, n: int) -> None:
    """Drop every decoder block of ``model`` after the ``n``-th (its LM head then no longer
    gives the model's logits: for activation capture only)."""
    import gc

    blocks = decoder_layers(model)
    if not 1 <= n <= len(blocks):
        raise ValueError(f"keep_layers must be in 1..{len(blocks)}, got {n}")
    if n == len(blocks):
        return
    del blocks[n:]
    for cfg in {id(c): c for c in (model.config, getattr(model.config, "text_config", None))
                if c is not None}.values():
        cfg.num_hidden_layers = n
        if getattr(cfg, "layer_types", None):
            cfg.layer_types = list(cfg.layer_types)[:n]
    gc.collect()
