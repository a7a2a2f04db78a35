"""Progress for long CLI work, on stderr.

On a terminal a ``tqdm`` bar (count, rate, ETA where the total is known); elsewhere (a log
file, CI) one line when the stage ends, and one every ``log_every_s`` while it runs, so a
log shows what ran, how much and how fast without a line per item::

    with Progress("encoding texts", total=n) as p:
        for batch in batches:
            ...
            p.advance(len(batch))
"""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO


class Progress:
    """``with Progress("publishing", total=n) as p: p.advance()``."""

    def __init__(
        self,
        label: str,
        total: int | None = None,
        every_s: float = 1.0,
        stream: TextIO | None = None,
        *,
        log_every_s: float = 30.0,
        unit: str = "it",
    ) -> None:
        self.label = label
        self.total = total
        self.every_s = every_s
        self.log_every_s = log_every_s
        self.stream = stream or sys.stderr
        self.count = 0
        self._start = time.monotonic()
        self._last = self._start
        self._bar: Any = None
        if self.stream.isatty():
            from tqdm import tqdm

            self._bar = tqdm(total=total, desc=label, file=self.stream, unit=unit,
                             mininterval=every_s, dynamic_ncols=True, leave=True)

    def advance(self, n: int = 1) -> None:
        self.count += n
        if self._bar is not None:
            self._bar.update(n)
            return
        now = time.monotonic()
        if now - self._last >= self.log_every_s:
            self._last = now
            self._line(final=False)

    def _line(self, final: bool) -> None:
        elapsed = max(time.monotonic() - self._start, 1e-9)
        rate = self.count / elapsed
        of = f"/{self.total}" if self.total is not None else ""
        eta = ""
        if not final and self.total and rate > 0:
            eta = f", ETA {max(0.0, (self.total - self.count) / rate):.0f} s"
        done = " done" if final else ""
        self.stream.write(f"{self.label}:{done} {self.count}{of} ({rate:,.1f}/s, "
                          f"{elapsed:.1f} s{eta})\n")
        self.stream.flush()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        else:
            self._line(final=True)

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
