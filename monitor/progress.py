"""A dependency-free progress line for long CLI work (stderr, throttled)."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    """``with Progress("publishing", total=n) as p: p.advance()`` prints a line at most
    every ``every_s`` seconds and a final one on exit."""

    def __init__(
        self,
        label: str,
        total: int | None = None,
        every_s: float = 1.0,
        stream: TextIO | None = None,
    ) -> None:
        self.label = label
        self.total = total
        self.every_s = every_s
        self.stream = stream or sys.stderr
        self.count = 0
        self._start = time.monotonic()
        self._last = 0.0

    def advance(self, n: int = 1) -> None:
        self.count += n
        now = time.monotonic()
        if now - self._last >= self.every_s:
            self._last = now
            self._print(final=False)

    def _print(self, final: bool) -> None:
        elapsed = max(time.monotonic() - self._start, 1e-9)
        of = f"/{self.total}" if self.total is not None else ""
        end = "\n" if final or not self.stream.isatty() else "\r"
        self.stream.write(
            f"{self.label}: {self.count}{of} ({self.count / elapsed:,.0f}/s, {elapsed:.1f} s){end}"
        )
        self.stream.flush()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self._print(final=True)
