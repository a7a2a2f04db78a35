"""Placeholder: filled in by the dashboards work (issue 7)."""

from __future__ import annotations

from typing import Any


def add_parser(sub: Any) -> None:
    return None
