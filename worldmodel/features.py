"""Steps → model inputs. One path for training (transitions) and scoring (live steps).

Every distinct text is encoded once (``TextEncoder`` caches by content) and
every screenshot decoded once; a step is then a row of indices into those
tables, and a batch is a gather.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from worldmodel.data import Transition, View
from worldmodel.encoders import TEXT_DIM, TextEncoder
from worldmodel.model import GUI_KINDS, REL_DIM, Batch, JEPAConfig

GUI_DIM = len(GUI_KINDS) + 2

CHUNK_CHARS = 400
MAX_CHUNKS = 32


def chunks(text: str, size: int = CHUNK_CHARS, limit: int = MAX_CHUNKS) -> list[str]:
    """Line-aligned pieces of at most ``size`` characters (a long tool result holds many
    things; an instruction buried in it must not be averaged away)."""
    out: list[str] = []
    cur = ""
    for line in text.splitlines() or [text]:
        while len(line) > size:
            out.append(line[:size])
            line = line[size:]
        if cur and len(cur) + len(line) + 1 > size:
            out.append(cur)
            cur = ""
        cur = f"{cur}\n{line}" if cur else line
    if cur.strip():
        out.append(cur)
    return [c for c in out if c.strip()][:limit]


@dataclass(frozen=True)
class StepInput:
    """One step to score or train on, in the world model's terms."""

    task: str
    observation: View
    action_text: str
    gui: dict[str, Any] | None = None
    history: tuple[tuple[str, str], ...] = ()  # (observation text, action text), oldest first
    next_observation: View | None = None  # None before the action has run


def step_input(t: Transition) -> StepInput:
    return StepInput(t.task, t.observation, t.action_text, t.gui, t.history, t.next_observation)


def gui_features(
    gui: dict[str, Any] | None, width: float = 160.0, height: float = 210.0
) -> np.ndarray:
    v = np.zeros(GUI_DIM, dtype=np.float32)
    kind = (gui or {}).get("kind") or "none"
    v[GUI_KINDS.index(kind) if kind in GUI_KINDS else GUI_KINDS.index("other")] = 1.0
    if gui:
        x, y = gui.get("x"), gui.get("y")
        if isinstance(x, int | float) and isinstance(y, int | float):
            v[-2], v[-1] = float(x) / width, float(y) / height
    return v


def load_image(ref: str, base: Path | None, size: int) -> np.ndarray:
    """A screenshot (path relative to ``base``, or a data: URI) → (3, size, size) uint8."""
    from PIL import Image

    if ref.startswith("data:"):
        raw = base64.b64decode(ref.split(",", 1)[1])
        src = Image.open(io.BytesIO(raw))
    else:
        p = Path(ref)
        src = Image.open(p if p.is_absolute() or base is None else base / p)
    img = src.convert("RGB").resize((size, size), Image.Resampling.BILINEAR)
    return np.asarray(img, dtype=np.uint8).transpose(2, 0, 1).copy()


@dataclass
class Tables:
    """Index form of a list of steps: texts and images by row, steps as indices."""

    text: np.ndarray  # (U, 384) float32
    images: np.ndarray  # (I, 3, S, S) uint8
    task: np.ndarray  # (N,) int
    obs: np.ndarray  # (N, H+1) int, -1 = padding
    act: np.ndarray  # (N, H+1) int
    gui: np.ndarray  # (N, H+1, GUI_DIM) float32
    obs_img: np.ndarray  # (N, H+1) int, -1 = none
    nxt: np.ndarray  # (N,) int, -1 = not observed yet
    nxt_img: np.ndarray  # (N,) int
    rel: np.ndarray | None = None  # (N, REL_DIM) relational features, see ``relational``
    # text rows of the pieces of each step's observation, earlier observations, next observation
    obs_chunks: list[list[int]] = field(default_factory=list)
    hist_chunks: list[list[int]] = field(default_factory=list)
    next_chunks: list[list[int]] = field(default_factory=list)

    def __len__(self) -> int:
        return int(self.task.shape[0])


def tabulate(
    steps: Sequence[StepInput],
    encoder: TextEncoder,
    config: JEPAConfig,
    *,
    image_base: Path | None = None,
) -> Tables:
    n, h = len(steps), config.history
    texts: dict[str, int] = {"": 0}
    images: dict[str, int] = {}

    def tid(s: str) -> int:
        return texts.setdefault(s, len(texts))

    def iid(v: View | None) -> int:
        if v is None or not v.screenshot or not config.use_images:
            return -1
        return images.setdefault(v.screenshot, len(images))

    task = np.zeros(n, dtype=np.int64)
    obs = np.full((n, h + 1), -1, dtype=np.int64)
    act = np.full((n, h + 1), -1, dtype=np.int64)
    gui = np.zeros((n, h + 1, GUI_DIM), dtype=np.float32)
    obs_img = np.full((n, h + 1), -1, dtype=np.int64)
    nxt = np.full(n, -1, dtype=np.int64)
    nxt_img = np.full(n, -1, dtype=np.int64)
    obs_chunks: list[list[int]] = []
    hist_chunks: list[list[int]] = []
    next_chunks: list[list[int]] = []
    for i, s in enumerate(steps):
        task[i] = tid(s.task)
        hist = list(s.history)[-h:] if h else []
        off = h - len(hist)
        for j, (o_text, a_text) in enumerate(hist):
            obs[i, off + j] = tid(o_text)
            act[i, off + j] = tid(a_text)
            gui[i, off + j] = gui_features(None)
        obs[i, h] = tid(s.observation.text)
        act[i, h] = tid(s.action_text)
        gui[i, h] = gui_features(s.gui)
        obs_img[i, h] = iid(s.observation)
        obs_chunks.append([tid(c) for c in chunks(s.observation.text)])
        hist_chunks.append([tid(c) for o_text, _ in hist for c in chunks(o_text)])
        next_chunks.append(
            [tid(c) for c in chunks(s.next_observation.text)] if s.next_observation else []
        )
        if s.next_observation is not None:
            nxt[i] = tid(s.next_observation.text)
            nxt_img[i] = iid(s.next_observation)
    text = encoder.encode(list(texts))
    text[0] = 0.0  # padding / empty
    rel = relational(text, task, obs[:, h], act[:, h], obs_chunks, hist_chunks)
    size = config.image_size
    imgs = np.zeros((len(images), 3, size, size), dtype=np.uint8)
    for ref, k in images.items():
        imgs[k] = load_image(ref, image_base, size)
    return Tables(
        text,
        imgs,
        task,
        obs,
        act,
        gui,
        obs_img,
        nxt,
        nxt_img,
        rel,
        obs_chunks,
        hist_chunks,
        next_chunks,
    )


def relational(
    text: np.ndarray,
    task: np.ndarray,
    obs: np.ndarray,
    act: np.ndarray,
    obs_chunks: list[list[int]],
    hist_chunks: list[list[int]],
) -> np.ndarray:
    """How the action relates to what the agent was asked and what it read.

    Cosines in the frozen text space (vectors are unit length): action·task,
    action·observation, the best-matching piece of the observation and of the
    earlier observations, how much better that piece matches than the task,
    and observation·task. An action that answers a passage of a tool result
    better than it answers the user is what a hijack looks like, whatever the
    tool is called.
    """
    n = len(task)
    a = text[act]
    out = np.zeros((n, REL_DIM), dtype=np.float32)
    out[:, 0] = (a * text[task]).sum(-1)
    out[:, 1] = (a * text[obs]).sum(-1)
    for i in range(n):
        if obs_chunks[i]:
            out[i, 2] = float((text[obs_chunks[i]] @ a[i]).max())
        if hist_chunks[i]:
            out[i, 3] = float((text[hist_chunks[i]] @ a[i]).max())
    out[:, 4] = np.maximum(out[:, 2], out[:, 3]) - out[:, 0]
    out[:, 5] = (text[obs] * text[task]).sum(-1)
    return out


def _images(tables: Tables, idx: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    has = torch.from_numpy(idx >= 0)
    safe = np.where(idx >= 0, idx, 0)
    if tables.images.shape[0] == 0:
        return torch.zeros(*idx.shape, 3, 1, 1), has
    img = torch.from_numpy(tables.images[safe]).float().div_(255.0)
    return img, has


def make_batch(
    tables: Tables,
    rows: np.ndarray,
    config: JEPAConfig,
    *,
    labels: np.ndarray | None = None,
    successor: np.ndarray | None = None,
    dynamics_weight: np.ndarray | None = None,
) -> Batch:
    """Gather ``rows`` into a Batch; ``successor[i]`` is the row of step t+1 (or -1)."""
    T = torch.from_numpy(tables.text)

    def txt(idx: np.ndarray) -> torch.Tensor:
        return T[torch.from_numpy(np.where(idx >= 0, idx, 0))]

    mask = torch.from_numpy(tables.obs[rows] >= 0)
    use_img = config.use_images and tables.images.shape[0] > 0
    obs_image, obs_has = _images(tables, tables.obs_img[rows])
    next_image, next_has = _images(tables, tables.nxt_img[rows])
    batch = Batch(
        task=txt(tables.task[rows]),
        obs_text=txt(tables.obs[rows]),
        obs_image=obs_image if use_img else None,
        obs_has_image=obs_has if use_img else torch.zeros_like(obs_has),
        act_text=txt(tables.act[rows]),
        act_gui=torch.from_numpy(tables.gui[rows]),
        mask=mask,
        next_text=txt(tables.nxt[rows]),
        next_image=next_image if use_img else None,
        next_has_image=next_has if use_img else torch.zeros_like(next_has),
        rel=None if tables.rel is None else torch.from_numpy(tables.rel[rows]),
        label=None if labels is None else torch.from_numpy(labels[rows].astype(np.float32)),
        dynamics_weight=None
        if dynamics_weight is None
        else torch.from_numpy(dynamics_weight[rows].astype(np.float32)),
    )
    if successor is not None:
        succ = successor[rows]
        has2 = succ >= 0
        s = np.where(has2, succ, rows)
        h = config.history
        batch.has_next2 = torch.from_numpy(has2)
        batch.a1_text = txt(tables.act[s, h])
        batch.a1_gui = torch.from_numpy(tables.gui[s, h])
        batch.next2_text = txt(tables.nxt[s])
        img2, has_img2 = _images(tables, tables.nxt_img[s])
        batch.next2_image = img2 if use_img else None
        batch.next2_has_image = has_img2 if use_img else torch.zeros_like(has_img2)
    return batch


__all__ = [
    "GUI_DIM",
    "REL_DIM",
    "chunks",
    "relational",
    "TEXT_DIM",
    "StepInput",
    "Tables",
    "make_batch",
    "step_input",
    "tabulate",
]
