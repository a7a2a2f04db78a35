"""Activation capture: render a step, run the probe model, pool hidden states, cache them.

The template (``TEMPLATE_VERSION``; its hash is part of every cache key and bundle)::

    Task: {task}
    Earlier:
    > {history observation 1}
    < {history action 1}
    ...                                   (the last ``history`` pairs)
    Observation: {observation}
    Action: {action}

Every observation is cut to ``obs_chars`` characters (head), the task to
``task_chars``. The action is kept whole up to ``action_tokens`` tokens; the
context before it is cut from the left so that the whole rendering is at most
``max_tokens`` tokens (BOS + context + action). Before tokenising, the action is cut
to ``action_tokens * TOKEN_CHARS`` characters (head) and an earlier action to
``max_tokens * TOKEN_CHARS`` (tail, the end the left cut keeps): no token is that
long, so the tokens are the same and a 50 MB action costs what a short one does.
Only the action's tokens are pooled: ``last`` takes the hidden state of the
action's final token (which has attended to the whole context), ``mean``
averages over the action's tokens.

An embeddings endpoint (:mod:`probes.remote`) reads :meth:`Template.render_text`
(the same text, cut in characters) and gives one vector a step: pseudo-layer
``0``, pooling ``"embedding"``.

A layer ``L`` means the output of decoder block ``L`` (1-based, so layer
``num_layers`` is the last block, before the final norm), read by a forward
hook. The forward pass stops (by an exception from the deepest hook) once the
deepest requested layer is done, and the LM head is never run.

Activations are cached on disk under ``cache_dir/<cache key>-<template_hash>/``
(the cache key is the model hash, with the dtype appended where it is not
float32) as shards, each a ``keys.txt`` (one step hash a line) and one ``L<layer>-<pooling>.npy``
matrix per captured layer and pooling, so a sweep or an eval never recomputes
a (model, template, step, layer, pooling) it has seen. The CLI's default ``cache_dir``
is :func:`vigil.paths.probe_cache` (``$VIGIL_HOME/cache/probes``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from vigil.lm import LanguageModel, decoder_layers
from vigil.progress import Progress

POOLINGS = ("last", "mean")
TEMPLATE_VERSION = 1
CHARS_PER_TOKEN = 4  # how an endpoint's rendering is cut (its tokenizer is not at hand)
TOKEN_CHARS = 64  # more than any probe-model token spans (Gemma-3's longest: 31 characters)


@dataclass(frozen=True)
class ProbeStep:
    """What L1 sees of one agent step.

    ``activations`` are vectors a record carries (``{layer: vector}``, pooled
    as ``activations_pooling``) from the model named ``activations_model``; a
    bundle trained on that model's activations uses them instead of running
    its probe model.
    """

    task: str
    observation: str
    action: str
    history: tuple[tuple[str, str], ...] = ()
    step_id: str = ""
    activations: Mapping[int, Sequence[float]] | None = None
    activations_model: str | None = None
    activations_pooling: str | None = None

    @classmethod
    def from_transition(cls, t: Any) -> ProbeStep:
        """From a ``worldmodel.datasets.format.Transition``; attached activations come from
        ``meta``.

        ``t.meta["activations"] = {"model_id": ..., "pooling": ..., "layers": {"6": [...]}}``.
        """
        acts = (t.meta or {}).get("activations")
        layers = model = pooling = None
        if acts:
            layers = {int(k): v for k, v in acts["layers"].items()}
            model, pooling = acts.get("model_id"), acts.get("pooling")
        return cls(
            task=t.task,
            observation=t.observation.text,
            action=t.action_text,
            history=tuple(t.history),
            step_id=t.transition_id,
            activations=layers,
            activations_model=model,
            activations_pooling=pooling,
        )


@dataclass(frozen=True)
class Template:
    """How a step is rendered; see the module docstring."""

    history: int = 1
    obs_chars: int = 400
    task_chars: int = 300
    action_tokens: int = 40
    max_tokens: int = 96
    version: int = TEMPLATE_VERSION

    @property
    def hash(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:12]

    def to_dict(self) -> dict[str, int]:
        return asdict(self)

    def context(self, step: ProbeStep) -> str:
        parts = [f"Task: {step.task[: self.task_chars]}"]
        hist = step.history[-self.history :] if self.history else ()
        if hist:
            parts.append("Earlier:")
            for obs, act in hist:
                parts.append(f"> {obs[: self.obs_chars]}")
                parts.append(f"< {act[-self.max_tokens * TOKEN_CHARS :]}")
        parts.append(f"Observation: {step.observation[: self.obs_chars]}")
        return "\n".join(parts) + "\nAction:"

    def action(self, step: ProbeStep) -> str:
        """The head of the step's action that can hold its first ``action_tokens`` tokens."""
        return step.action[: self.action_tokens * TOKEN_CHARS]

    def render(self, step: ProbeStep) -> str:
        """The text the model reads (before token truncation)."""
        return f"{self.context(step)} {self.action(step)}"

    def render_text(self, step: ProbeStep) -> str:
        """The rendering for a model whose tokenizer is not at hand (an embeddings endpoint).

        The same text as :meth:`render`, cut in characters at ``CHARS_PER_TOKEN``
        a token: the action to ``action_tokens``, the context from the left so
        that the whole is at most ``max_tokens`` tokens' worth, the action last.
        """
        act = step.action[: CHARS_PER_TOKEN * self.action_tokens]
        room = max(0, CHARS_PER_TOKEN * self.max_tokens - len(act) - 1)
        ctx = self.context(step)[-room:] if room else ""
        return f"{ctx} {act}"

    def step_hash(self, step: ProbeStep) -> str:
        return hashlib.sha256(self.render(step).encode()).hexdigest()[:24]


def identity_hash(model_id: str, dims: int) -> str:
    """The hash of a model known only by name and width (an endpoint's, or a record's policy)."""
    return hashlib.sha256(f"{model_id}:{dims}".encode()).hexdigest()[:16]


def encode_step(tokenizer: Any, template: Template, step: ProbeStep) -> tuple[list[int], int]:
    """Token ids (BOS + left-cut context + action) and the number of action tokens at the end."""
    ctx = tokenizer(template.context(step), add_special_tokens=False)["input_ids"]
    act = tokenizer(" " + template.action(step), add_special_tokens=False)["input_ids"]
    act = act[: template.action_tokens] or [tokenizer.eos_token_id or 0]
    bos = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []
    room = max(0, template.max_tokens - len(bos) - len(act))
    ctx = ctx[-room:] if room else []
    return bos + ctx + act, len(act)


class _Stop(Exception):
    pass


def _backbone(model: Any) -> Any:
    """The model without its LM head (so the vocabulary projection never runs)."""
    return getattr(model, "model", None) or getattr(model, "transformer", None) or model


def capture_batch(
    lm: LanguageModel,
    template: Template,
    steps: Sequence[ProbeStep],
    layers: Sequence[int],
) -> dict[tuple[int, str], np.ndarray]:
    """Run one batch; ``{(layer, pooling): (len(steps), hidden) float32}``."""
    return pool_hidden(lm, [encode_step(lm.tokenizer, template, s) for s in steps], layers)


def pool_hidden(
    lm: LanguageModel, enc: Sequence[tuple[list[int], int]], layers: Sequence[int]
) -> dict[tuple[int, str], np.ndarray]:
    """Forward token sequences; pool each over its last ``n`` tokens (``(ids, n)`` pairs).

    ``{(layer, "last"|"mean"): (len(enc), hidden) float32}``; the pass stops
    after the deepest requested layer.
    """
    import torch

    n, width = len(enc), max(len(ids) for ids, _ in enc)
    pad = lm.tokenizer.pad_token_id or 0
    ids = torch.full((n, width), pad, dtype=torch.long)
    mask = torch.zeros((n, width), dtype=torch.long)
    for i, (tok, _) in enumerate(enc):
        ids[i, : len(tok)] = torch.tensor(tok)
        mask[i, : len(tok)] = 1
    lengths = torch.tensor([len(t) for t, _ in enc])
    n_act = torch.tensor([a for _, a in enc])
    pos = torch.arange(width)[None, :]
    act_mask = ((pos >= (lengths - n_act)[:, None]) & (pos < lengths[:, None])).float()
    last = lengths - 1

    blocks = decoder_layers(lm.model)
    deepest = max(layers)
    if min(layers) < 1 or deepest > len(blocks):
        raise ValueError(f"layers must be in 1..{len(blocks)}, got {sorted(layers)}")
    out: dict[tuple[int, str], np.ndarray] = {}

    def hook_for(layer: int) -> Callable[..., None]:
        def hook(_m: Any, _inp: Any, output: Any) -> None:
            h = output[0] if isinstance(output, tuple) else output
            h = h.float()
            out[(layer, "last")] = h[torch.arange(n), last].numpy().copy()
            mean = (h * act_mask[..., None]).sum(1) / act_mask.sum(1, keepdim=True)
            out[(layer, "mean")] = mean.numpy().copy()
            if layer == deepest:
                raise _Stop

        return hook

    handles = [blocks[layer - 1].register_forward_hook(hook_for(layer)) for layer in set(layers)]
    try:
        with torch.inference_mode(), contextlib.suppress(_Stop):
            _backbone(lm.model)(input_ids=ids, attention_mask=mask, use_cache=False)
    finally:
        for h in handles:
            h.remove()
    return out


class ActivationSource(Protocol):
    """What :func:`extract` reads activations from: a local model
    (:class:`probes.models.ProbeModel`) or an embeddings endpoint (:mod:`probes.remote`)."""

    @property
    def model_id(self) -> str: ...

    @property
    def model_hash(self) -> str: ...

    @property
    def path(self) -> str: ...

    @property
    def cache_key(self) -> str: ...

    @property
    def poolings(self) -> tuple[str, ...]: ...

    @property
    def available_layers(self) -> list[int]: ...

    @property
    def source(self) -> str: ...  # "model" | "endpoint" (what a bundle records)

    def capture_batch(
        self, template: Template, steps: Sequence[ProbeStep], layers: Sequence[int]
    ) -> dict[tuple[int, str], np.ndarray]: ...


@dataclass
class ActivationCache:
    """Pooled activations on disk, by (model hash, template hash, step hash, layer, pooling)."""

    root: Path
    model_hash: str
    template_hash: str
    _index: dict[tuple[int, str], dict[str, tuple[Path, int]]] = field(default_factory=dict)
    _loaded: bool = False

    @property
    def folder(self) -> Path:
        return Path(self.root) / f"{self.model_hash}-{self.template_hash}"

    def _load_index(self) -> None:
        if self._loaded:
            return
        self._loaded = True
        if not self.folder.exists():
            return
        for shard in sorted(self.folder.iterdir()):
            keys_file = shard / "keys.txt"
            if not keys_file.exists():
                continue  # a shard still being written, or a crashed write
            keys = keys_file.read_text().split()
            for f in shard.glob("L*-*.npy"):
                layer_s, pooling = f.stem[1:].split("-", 1)
                idx = self._index.setdefault((int(layer_s), pooling), {})
                for row, k in enumerate(keys):
                    idx[k] = (f, row)

    def missing(self, keys: Iterable[str], layer: int, pooling: str) -> list[str]:
        self._load_index()
        idx = self._index.get((layer, pooling), {})
        return [k for k in keys if k not in idx]

    def write(self, keys: Sequence[str], arrays: Mapping[tuple[int, str], np.ndarray]) -> None:
        self._load_index()
        shard = self.folder / f"{time.strftime('%Y%m%d%H%M%S')}-{uuid.uuid4().hex[:8]}"
        shard.mkdir(parents=True)
        for (layer, pooling), a in arrays.items():
            f = shard / f"L{layer}-{pooling}.npy"
            np.save(f, a.astype(np.float32))
            idx = self._index.setdefault((layer, pooling), {})
            for row, k in enumerate(keys):
                idx[k] = (f, row)
        (shard / "keys.txt").write_text("\n".join(keys) + "\n")  # last: marks the shard complete

    def read(self, keys: Sequence[str], layer: int, pooling: str) -> np.ndarray:
        self._load_index()
        idx = self._index[(layer, pooling)]
        by_file: dict[Path, list[tuple[int, int]]] = {}
        for i, k in enumerate(keys):
            f, row = idx[k]
            by_file.setdefault(f, []).append((i, row))
        out: np.ndarray | None = None
        for f, pairs in by_file.items():
            m = np.load(f, mmap_mode="r")
            if out is None:
                out = np.empty((len(keys), m.shape[1]), dtype=np.float32)
            rows = np.array([r for _, r in pairs])
            out[[i for i, _ in pairs]] = m[rows]
        return out if out is not None else np.empty((0, 0), dtype=np.float32)


@dataclass
class ExtractStats:
    steps: int = 0
    computed: int = 0
    seconds: float = 0.0

    @property
    def steps_per_s(self) -> float:
        return self.computed / self.seconds if self.seconds else 0.0


def extract(
    pm: ActivationSource,
    steps: Sequence[ProbeStep],
    layers: Sequence[int],
    *,
    template: Template | None = None,
    cache_dir: str | Path | None = None,
    batch_size: int = 16,
    progress: bool = True,
    stats: ExtractStats | None = None,
) -> dict[tuple[int, str], np.ndarray]:
    """Pooled activations ``{(layer, pooling): (len(steps), hidden)}`` for every layer and pooling.

    Steps already in the cache are read, the rest computed (sorted by length,
    batched) and written to the cache; with ``cache_dir=None`` nothing is cached.
    """
    template = template or Template()
    layers = sorted(set(layers))
    bad = sorted(set(layers) - set(pm.available_layers))
    if bad:
        raise ValueError(
            f"{pm.model_id} has no layer {bad[0]}; it offers {_span(pm.available_layers)}"
        )
    keys = [template.step_hash(s) for s in steps]
    cache = ActivationCache(Path(cache_dir), pm.cache_key, template.hash) if cache_dir else None
    todo_keys: set[str] = set(keys)
    if cache is not None:
        todo_keys = set()
        for layer in layers:
            for pooling in pm.poolings:
                todo_keys.update(cache.missing(keys, layer, pooling))
    first: dict[str, int] = {}
    for i, k in enumerate(keys):
        first.setdefault(k, i)
    todo = sorted((first[k] for k in todo_keys), key=lambda i: len(template.render(steps[i])))
    stats = stats if stats is not None else ExtractStats()
    stats.steps += len(steps)
    computed: dict[str, dict[tuple[int, str], np.ndarray]] = {}
    t0 = time.perf_counter()
    shard_keys: list[str] = []
    shard_parts: list[dict[tuple[int, str], np.ndarray]] = []

    def flush() -> None:
        if cache is not None and shard_keys:
            cache.write(
                list(shard_keys),
                {lp: np.concatenate([p[lp] for p in shard_parts]) for lp in shard_parts[0]},
            )
        shard_keys.clear()
        shard_parts.clear()

    bar = Progress("probes: extracting activations", total=len(todo), unit="step",
                   stream=sys.stderr) if progress and todo else None
    for b in range(0, len(todo), batch_size):
        idx = todo[b : b + batch_size]
        got = pm.capture_batch(template, [steps[i] for i in idx], layers)
        for j, i in enumerate(idx):
            computed[keys[i]] = {lp: a[j] for lp, a in got.items()}
        shard_keys.extend(keys[i] for i in idx)
        shard_parts.append(got)
        if len(shard_keys) >= 2048:
            flush()
        if bar is not None:
            bar.advance(len(idx))
    if bar is not None:
        bar.close()
    flush()
    stats.computed += len(todo)
    stats.seconds += time.perf_counter() - t0

    out: dict[tuple[int, str], np.ndarray] = {}
    for layer in layers:
        for pooling in pm.poolings:
            if cache is not None:
                out[(layer, pooling)] = cache.read(keys, layer, pooling)
            else:
                out[(layer, pooling)] = np.stack([computed[k][(layer, pooling)] for k in keys])
    return out


def _span(layers: Sequence[int]) -> str:
    xs = sorted(layers)
    if len(xs) > 1 and xs == list(range(xs[0], xs[-1] + 1)):
        return f"layers {xs[0]}..{xs[-1]}"
    return "layer " + ", ".join(map(str, xs))
