"""What the agent sees and does on a MiniWoB page: views, element helpers, commands.

A :class:`Page` is one observation (utterance, task fields, DOM, screenshot);
its ``text`` is the view stored in the dataset: the utterance plus a compact
DOM text, one ``<tag ref=N #id .class "text" value="..">`` line per element
that shows something, at most ``VIEW_CHARS`` characters. :func:`describe`
names an element the same way in action texts. A :class:`Command` clicks an
element, or clicks it and types text (``"\\n"`` is Enter).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Literal

import numpy as np
from miniwob.dom import DOMElement

VIEW_CHARS = 2000  # bound on a view's text: utterance + DOM text


def _classes(el: DOMElement) -> list[str]:
    return el.classes.split() if isinstance(el.classes, str) else []


def has_class(el: DOMElement, cls: str) -> bool:
    return cls in _classes(el)


def ancestor(el: DOMElement, pred: Callable[[DOMElement], bool]) -> DOMElement | None:
    node = el.parent
    while node is not None:
        if pred(node):
            return node
        node = node.parent
    return None


def descendant(el: DOMElement, pred: Callable[[DOMElement], bool]) -> DOMElement | None:
    return next((e for e in el.subtree_elements if pred(e)), None)


def center(el: DOMElement) -> tuple[int, int]:
    return round(el.left + el.width / 2), round(el.top + el.height / 2)


def label_text(el: DOMElement) -> str:
    """The text next to a checkbox or radio button (its label's other text)."""
    parent = el.parent
    if parent is None:
        return ""
    return " ".join(c.text or "" for c in parent.children if c is not el and c.text).strip()


_GENERIC_CLASS = re.compile(r"^ui-(corner|widget|helper|state-default|front)")
FIELD_TAGS = ("input_", "textarea", "select")


def describe(el: DOMElement) -> str:
    """``<button ref=12 #subbtn .primary "Submit">``: an element as actions and views name it."""
    if el.tag == "t":
        return _quote(el.text or "", 40)
    parts = [el.tag, f"ref={el.ref}"]
    if el.id:
        parts.append(f"#{el.id}")
    parts += [f".{c}" for c in _classes(el) if not _GENERIC_CLASS.match(c)][-2:]
    if el.text:
        parts.append(_quote(el.text, 40))
    if el.tag in ("input_checkbox", "input_radio"):
        parts.append("checked" if el.value else "unchecked")
    elif el.value is not None and el.tag.startswith(FIELD_TAGS):
        parts.append(f"value={_quote(str(el.value), 40)}")
    return "<" + " ".join(parts) + ">"


def _quote(text: str, limit: int) -> str:
    return json.dumps(text if len(text) <= limit else text[: limit - 1] + "…", ensure_ascii=False)


def _shown(el: DOMElement) -> bool:
    """Whether an element earns a line in the DOM text (containers by id or as controls)."""
    if el.tag == "body" or el.id in ("wrap", "area"):
        return False
    if el.tag == "t":
        return bool(el.text)
    if not el.is_leaf:
        return bool(el.id) or el.tag in ("button", "a", "select")
    if el.text or el.id or el.tag.startswith(FIELD_TAGS + ("button",)):
        return True
    # an empty leaf shows by its class (an icon: trash, star, reply, more), unless it
    # is a thin decoration (spacers, resize handles)
    return bool(_classes(el)) and min(el.width, el.height) >= 5


def _view_text(utterance: str, root: DOMElement) -> str:
    lines = [utterance]
    used = len(utterance)
    elements = [e for e in root.subtree_elements if _shown(e)]
    for n, el in enumerate(elements):
        line = describe(el)
        if used + 1 + len(line) > VIEW_CHARS - 24:
            lines.append(f"… ({len(elements) - n} more)")
            break
        lines.append(line)
        used += 1 + len(line)
    return "\n".join(lines)


@dataclass(frozen=True)
class Page:
    utterance: str
    fields: dict[str, str]
    root: DOMElement
    screenshot: np.ndarray

    @cached_property
    def elements(self) -> list[DOMElement]:
        return list(self.root.subtree_elements)

    @cached_property
    def text(self) -> str:
        return _view_text(self.utterance, self.root)

    def by_ref(self, ref: int) -> DOMElement:
        return next(e for e in self.elements if e.ref == ref)

    def by_id(self, id_: str) -> DOMElement | None:
        return next((e for e in self.elements if e.id == id_), None)

    def with_class(self, cls: str) -> list[DOMElement]:
        return [e for e in self.elements if has_class(e, cls)]

    def find(self, pred: Callable[[DOMElement], bool]) -> DOMElement | None:
        return next((e for e in self.elements if pred(e)), None)


def page_from(obs: Mapping[str, Any], root: DOMElement) -> Page:
    return Page(obs["utterance"], dict(obs["fields"]), root, obs["screenshot"])


@dataclass(frozen=True)
class Command:
    kind: Literal["click", "type"]
    ref: int
    text: str = ""
