"""The values an action uses, as provenance looks them up (:mod:`worldmodel.provenance`).

A tool call's argument leaves (nested dicts and lists walked iteratively, bounded by
:data:`MAX_DEPTH` and :data:`MAX_NODES`), or the literal arguments of a call-like action
text (``f(a='x', b=5)``, the first :data:`MAX_CALL_CHARS` characters); each value as the
forms it may appear in where the agent read it: folded text (:func:`worldmodel.acts.fold_text`:
look-alikes and invisible characters read through, casefolded, the first
:data:`MAX_VALUE_CHARS` characters), a number as prose writes it (``1,000.00``), an ISO date
as ``may 13th``.
"""

from __future__ import annotations

import ast
import math
import re
from collections.abc import Iterator
from typing import Any

from worldmodel.acts import fold_text

MAX_NODES, MAX_DEPTH, MAX_VALUE_CHARS, MAX_CALL_CHARS = 512, 12, 1024, 4096
_WS = re.compile(r"\s+")
_TRIM = " \t\r\n'\"`.,;:!?()[]{}<>*"

_NUMBER = re.compile(r"[-+]?\d{1,15}(?:,\d{3})*(?:\.\d+)?")
_DATE = re.compile(r"(\d{4})-(\d\d)-(\d\d)")
_MONTHS = ("january", "february", "march", "april", "may", "june", "july", "august",
           "september", "october", "november", "december")
Value = tuple[tuple[str, ...], bool]  # (normalised forms looked for, numeric)


def _number_forms(x: float) -> tuple[str, ...]:
    if not math.isfinite(x) or abs(x) >= 1e15:
        return ()
    i = int(x)
    forms = [str(i), f"{i}.0", f"{i}.00", f"{i:,}", f"{i:,}.00"] if x == i else \
        [repr(x), f"{x:.2f}", f"{x:,.2f}"]
    return tuple(dict.fromkeys(forms))


def _date_forms(s: str) -> tuple[str, ...]:
    """An ISO date (or date-time) as prose writes it too: ``may 13th``, ``13 may``, ..."""
    m = _DATE.match(s)
    if m is None or not 1 <= int(m[2]) <= 12:
        return ()
    mon, d = _MONTHS[int(m[2]) - 1], int(m[3])
    th = "th" if 10 <= d <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(d % 10, "th")
    return m[0], f"{mon} {d}{th}", f"{mon} {d}", f"{d}{th} of {mon}", f"{d}{th} {mon}", f"{d} {mon}"


def _value(leaf: Any) -> Value | None:
    if isinstance(leaf, bool) or not isinstance(leaf, int | float | str):
        return None
    if not isinstance(leaf, str):
        forms = _number_forms(float(leaf)) if abs(leaf) < 1e15 else ()
        return (forms, True) if forms else None
    s = _WS.sub(" ", fold_text(leaf[:MAX_VALUE_CHARS])).strip(_TRIM)
    if _NUMBER.fullmatch(s):
        return tuple(dict.fromkeys((s, *_number_forms(float(s.replace(",", "")))))), True
    return (tuple(dict.fromkeys((s, *_date_forms(s)))), False) if len(s) >= 2 else None


def _walk(root: Any) -> Iterator[Any]:
    """Leaves of nested dicts / lists (values only, never keys), bounded in depth and size."""
    stack, nodes = [(root, 0)], 0
    while stack and nodes < MAX_NODES:
        obj, depth = stack.pop()
        nodes += 1
        if not isinstance(obj, dict | list | tuple):
            yield obj
        elif depth < MAX_DEPTH:
            children = []
            for child in obj.values() if isinstance(obj, dict) else obj:
                children.append((child, depth + 1))
                if len(children) >= MAX_NODES:
                    break
            stack.extend(reversed(children))


_CALL = re.compile(r"^\s*[A-Za-z_][\w.]*\s*\(.*\)\s*;?\s*$", re.S)
_KWARG = re.compile(r"\b\w+\s*=\s*('(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|-?\d+(?:\.\d+)?)")


def call_arguments(text: str) -> list[Any]:
    """The literal arguments of a call-like action text (``f(a='x', b=5)``), else none."""
    text = text[:MAX_CALL_CHARS]
    for cand in [text] + [ln for ln in text.splitlines()[-8:] if "(" in ln]:
        if not _CALL.match(cand):
            continue
        try:
            node = ast.parse(cand.strip().rstrip(";"), mode="eval").body
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            continue
        if not isinstance(node, ast.Call):
            continue
        out: list[Any] = []
        for arg in [*node.args, *(k.value for k in node.keywords)]:
            try:
                out.append(ast.literal_eval(arg))
            except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
                continue
        return out
    if _CALL.search(text) is None:  # not call-like: no values
        return []
    return [r[1:-1] if r[0] in "'\"" else float(r) for r in _KWARG.findall(text)]
