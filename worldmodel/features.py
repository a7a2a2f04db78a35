"""Steps → model inputs. One path for training (transitions) and scoring (live steps).

Every distinct text is encoded once (``TextEncoder`` caches by content) and
every screenshot decoded once; a step is then a row of indices into those
tables, and a batch is a gather.

A text's cost is bounded before any model work: every text of a step is cut to
``MAX_TEXT_CHARS`` (with a visible marker, :func:`cut_text`), and :func:`chunks`
stops at its ``limit``-th piece, so a 50 MB tool result costs what a 256 KB one does.

Tool identity can be masked (``tabulate(..., mask_tools=True)``, the default of
``train.TrainConfig``): every action text the model reads (the step's and its history's)
then goes through :func:`mask_action` first, which replaces called function names with
``tool`` and argument keys with ``arg1``, ``arg2``, ... (argument values kept), so a harm
head cannot learn which tool was called, only what was done with what.
"""

from __future__ import annotations

import base64
import io
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from worldmodel.datasets.format import Transition, View
from worldmodel.encoders import TEXT_DIM, TextEncoding
from worldmodel.model import GUI_KINDS, REL_DIM, Batch, JEPAConfig

GUI_DIM = len(GUI_KINDS) + 2

CHUNK_CHARS = 400
MAX_CHUNKS = 32
MAX_TEXT_CHARS = 256 * 1024  # of one text (task, observation, action, result); the rest is cut
# what str.splitlines() splits on, "\r\n" first
_LINE_BREAK = re.compile(r"\r\n|[\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029]")


TOOL_PLACEHOLDER = "tool"
ARG_PLACEHOLDER = "arg"  # arg1, arg2, ... by first occurrence in the action
_IDENT = r"[A-Za-z_][\w.]*"
_CALL_HEAD = re.compile(rf"(?<![\w.])({_IDENT})\(")  # send_money(
_REACT_ACTION = re.compile(r"^([ \t]*Action[ \t]*:[ \t]*)([^\s(]+)", re.M)  # Action: GmailSend
_JSON_NAME = re.compile(  # {"name": "send_money", "arguments": ...}: tool-call JSON
    rf"""(["'])(?:name|function|tool|tool_name)\1\s*:\s*(["'])({_IDENT})\2"""
    r"""(?=\s*,\s*["'](?:arguments|parameters|args|input)["'])"""
)
_KWARG = re.compile(r"(?<=[(,])(\s*)([A-Za-z_]\w*)(\s*=)(?!=)")  # (recipient= , amount=
_KEY = re.compile(r"""(["'])([A-Za-z_][\w-]*)\1(\s*:)""")  # "recipient":
_WORD = re.compile(r"(?<![\w.])[A-Za-z_][\w-]*(?:\.[A-Za-z_][\w-]*)*")


def _identifier_like(word: str) -> bool:
    """A name no prose uses as a word (``send_money``, ``GmailSendEmail``, ``patient_id``):
    masked wherever it occurs, not only where it is called or keyed."""
    return any(c in word for c in "_.0123456789") or any(c.isupper() for c in word[1:])


def mask_action(text: str, tool: dict[str, Any] | None = None) -> str:
    """``text`` with called function names replaced by ``tool`` and argument keys by
    ``arg1``, ``arg2``, ... (in order of first occurrence); argument values are kept.

    Names are read from the text itself (``name(...)`` calls, ReAct ``Action: Name`` lines,
    ``{"name": "..."}`` tool-call JSON) and from ``tool`` (``{"name", "arguments"}``) when
    given; keys from ``key=`` inside a call, ``"key":`` anywhere, and ``tool["arguments"]``.
    A name or key that looks like an identifier (``send_money``, ``patient_id``) is replaced
    wherever it occurs, so a thought that mentions it is masked too; a plain word (``query``)
    only where it is called or keyed, so prose keeps its words. Reading the text alone gives
    the same result as with ``tool`` for actions that spell their call out (AgentDojo's
    ``name(key=value)``, ToolEmu's ``Action:``/``Action Input:``), so a live step, which
    carries only text, is masked as its training rows were.
    """
    names: dict[str, None] = {}  # ordered sets
    keys: dict[str, None] = {}
    if tool and isinstance(tool.get("name"), str) and tool["name"]:
        names[tool["name"]] = None
    for m in _REACT_ACTION.finditer(text):
        names[m.group(2)] = None
    for m in _JSON_NAME.finditer(text):
        names[m.group(3)] = None
    for m in _CALL_HEAD.finditer(text):
        names[m.group(1)] = None
    found = [(m.start(2), m.group(2)) for m in _KWARG.finditer(text)]
    found += [(m.start(2), m.group(2)) for m in _KEY.finditer(text)]
    keys.update((k, None) for _, k in sorted(found))
    args = (tool or {}).get("arguments")
    if isinstance(args, dict):  # after the text's own: numbering follows the text
        keys.update((str(k), None) for k in args)
    for n in names:
        keys.pop(n, None)
    if not names and not keys:
        return text
    placeholder = {k: f"{ARG_PLACEHOLDER}{i}" for i, k in enumerate(keys, 1)}

    # names where they are called, then keys where they key
    text = _REACT_ACTION.sub(lambda m: f"{m[1]}{TOOL_PLACEHOLDER}", text)
    text = _JSON_NAME.sub(lambda m: m[0][: m.start(3) - m.start(0)] + TOOL_PLACEHOLDER + m[2], text)
    text = _CALL_HEAD.sub(lambda m: f"{TOOL_PLACEHOLDER}(" if m[1] in names else m[0], text)
    text = _KWARG.sub(lambda m: f"{m[1]}{placeholder.get(m[2], m[2])}{m[3]}", text)
    text = _KEY.sub(lambda m: f"{m[1]}{placeholder.get(m[2], m[2])}{m[1]}{m[3]}", text)
    # identifier-like names and keys wherever else they occur (a thought naming its tool)
    everywhere = {n: TOOL_PLACEHOLDER for n in names if _identifier_like(n)}
    everywhere.update((k, v) for k, v in placeholder.items() if _identifier_like(k))
    if everywhere:  # one pass over the words, whatever their number
        text = _WORD.sub(lambda m: everywhere.get(m[0], m[0]), text)
    return text


def mask_tool(tool: dict[str, Any] | None) -> dict[str, Any] | None:
    """A tool call ``{"name", "arguments"}`` with the name ``tool`` and the argument keys
    ``arg1``, ``arg2``, ... in their order (values kept): the dict form of :func:`mask_action`."""
    if tool is None:
        return None
    args = tool.get("arguments")
    masked = (
        {f"{ARG_PLACEHOLDER}{i}": v for i, v in enumerate(args.values(), 1)}
        if isinstance(args, dict)
        else args
    )
    return {**tool, "name": TOOL_PLACEHOLDER, "arguments": masked}


def cut_text(text: str, limit: int = MAX_TEXT_CHARS) -> str:
    """``text`` if it has at most ``limit`` characters, else its head and a marker saying how
    much was cut (the head is what the models read; a tool result's instructions come early)."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}\n[vigil: {len(text) - limit} more characters cut]"


def chunks(
    text: str, size: int = CHUNK_CHARS, limit: int = MAX_CHUNKS, max_chars: int = MAX_TEXT_CHARS
) -> list[str]:
    """Line-aligned pieces of at most ``size`` characters: the first ``limit`` that are not
    blank, in text order (a long tool result holds many things; an instruction buried in it
    must not be averaged away, and one at its head must not be pushed out by a long line
    after it). Short lines join into one piece; a line over ``size`` is cut into whole
    pieces, its rest joining the lines after it.

    Reads at most ``max_chars`` characters, never copies the text line by line, and stops
    once the first ``limit`` pieces are known, so the cost is bounded whatever the length
    of ``text``.
    """
    out: list[tuple[int, str]] = []  # (where the piece starts, the piece), not blank
    if limit <= 0:
        return []
    text = text[:max_chars]
    cur, cur_at = "", 0  # the piece being joined from short lines, and where it starts

    def flush() -> None:
        # ``cur`` starts before the pieces of a long line cut while it was being joined
        if cur.strip():
            out.append((cur_at, cur))
            out.sort(key=lambda piece: piece[0])
            del out[limit:]

    for start, end in _lines(text):
        if not cur and len(out) >= limit:
            break  # every later piece starts after the ``limit`` kept ones
        if end - start > size:  # a long line: whole pieces; the rest (1..size) goes on below
            whole = (end - start - 1) // size
            for at in range(start, start + whole * size, size):
                if len(out) >= limit:
                    break  # later pieces of this line come after the kept ones
                if (piece := text[at : at + size]).strip():
                    out.append((at, piece))
            start += whole * size
        if cur and len(cur) + (end - start) + 1 > size:
            flush()
            if len(out) >= limit:
                return [piece for _, piece in out]  # the rest starts after them all
            cur = ""
        if cur:
            cur = f"{cur}\n{text[start:end]}"
        else:
            cur, cur_at = text[start:end], start
    flush()
    return [piece for _, piece in out]


def _lines(text: str) -> Iterator[tuple[int, int]]:
    """(start, end) of each line of ``text``, as ``text.splitlines() or [text]`` has them,
    without copying the text."""
    start = 0
    for m in _LINE_BREAK.finditer(text):
        yield start, m.start()
        start = m.end()
    if start < len(text) or start == 0:
        yield start, len(text)


@dataclass(frozen=True)
class StepInput:
    """One step to score or train on, in the world model's terms."""

    task: str
    observation: View
    action_text: str
    gui: dict[str, Any] | None = None
    history: tuple[tuple[str, str], ...] = ()  # (observation text, action text), oldest first
    next_observation: View | None = None  # None before the action has run
    tool: dict[str, Any] | None = None  # the call, {"name", "arguments"}, where known


def step_input(t: Transition) -> StepInput:
    return StepInput(
        t.task, t.observation, t.action_text, t.gui, t.history, t.next_observation, t.tool
    )


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
    encoder: TextEncoding,
    config: JEPAConfig,
    *,
    image_base: Path | None = None,
    mask_tools: bool = False,
) -> Tables:
    """Index form of ``steps``; with ``mask_tools`` every action text (the step's and its
    history's) is read through :func:`mask_action`, so no tool name or argument key reaches
    the model. The text table is keyed by the text as read: a masked action is its own
    entry (and its own encoder-cache key), never an unmasked one's."""
    n, h = len(steps), config.history
    texts: dict[str, int] = {"": 0}
    images: dict[str, int] = {}

    def tid(s: str) -> int:
        return texts.setdefault(s, len(texts))

    def action(text: str, tool: dict[str, Any] | None = None) -> str:
        text = cut_text(text)
        return mask_action(text, tool) if mask_tools else text

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
        task[i] = tid(cut_text(s.task))
        hist = [(cut_text(o), action(a)) for o, a in s.history[-h:]] if h else []
        off = h - len(hist)
        for j, (o_text, a_text) in enumerate(hist):
            obs[i, off + j] = tid(o_text)
            act[i, off + j] = tid(a_text)
            gui[i, off + j] = gui_features(None)
        seen = cut_text(s.observation.text)
        obs[i, h] = tid(seen)
        act[i, h] = tid(action(s.action_text, s.tool))
        gui[i, h] = gui_features(s.gui)
        obs_img[i, h] = iid(s.observation)
        obs_chunks.append([tid(c) for c in chunks(seen)])
        hist_chunks.append([tid(c) for o_text, _ in hist for c in chunks(o_text)])
        next_chunks.append(
            [tid(c) for c in chunks(s.next_observation.text)] if s.next_observation else []
        )
        if s.next_observation is not None:
            nxt[i] = tid(cut_text(s.next_observation.text))
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


def pixels(images: np.ndarray) -> torch.Tensor:
    """Decoded images (``load_image``'s uint8, (..., 3, S, S)) as the vision tower reads them,
    in training and scoring alike: float in [0, 1]."""
    return torch.from_numpy(images).float().div_(255.0)


def _images(tables: Tables, idx: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    has = torch.from_numpy(idx >= 0)
    safe = np.where(idx >= 0, idx, 0)
    if tables.images.shape[0] == 0:
        return torch.zeros(*idx.shape, 3, 1, 1), has
    return pixels(tables.images[safe]), has


def make_batch(
    tables: Tables,
    rows: np.ndarray,
    config: JEPAConfig,
    *,
    labels: np.ndarray | None = None,
    bags: np.ndarray | None = None,
    successor: np.ndarray | None = None,
    dynamics_weight: np.ndarray | None = None,
) -> Batch:
    """Gather ``rows`` into a Batch; ``successor[i]`` is the row of step t+1 (or -1);
    ``bags[i]`` the trajectory of a row labelled only as part of it (-1: its own label)."""
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
        bag=None if bags is None else torch.from_numpy(bags[rows].astype(np.int64)),
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
    "MAX_TEXT_CHARS",
    "chunks",
    "cut_text",
    "mask_action",
    "mask_tool",
    "relational",
    "TEXT_DIM",
    "StepInput",
    "Tables",
    "load_image",
    "make_batch",
    "pixels",
    "step_input",
    "tabulate",
]
