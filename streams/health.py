"""Is the broker there? A watch that asks it, every second, for its topics.

A consumer whose broker has gone away just polls nothing, and a producer's
records wait in its buffer: neither says so. :class:`BrokerWatch` does. It asks
the broker for its topic list (one metadata request with a short timeout)
every ``interval_s``; two failed asks in a row mark the broker down, the first
answer after that marks it up, and each change is reported once through
``on_change(up, reason)``. A broker that answers but lacks some of the topics
(a memory broker that restarted empty) gets them made again, so consumers that
subscribed to them find them at their next metadata refresh.

Detection takes at most ``2 * (interval_s + timeout_s)``: a broker that died
refuses connections at once, one that hangs runs into ``timeout_s``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from streams.bus import Bus, DeliveryError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BrokerState:
    """What the watch knows: up or down, since when (monotonic), and why."""

    up: bool
    since: float
    reason: str = ""
    outages: int = 0  # times the broker went down since the watch started


class BrokerWatch:
    """Watches one broker through ``bus`` (a bus of its own: ``ping`` and
    ``ensure_topics`` are all it uses), making ``topics`` again where they are
    missing."""

    def __init__(
        self,
        bus: Bus,
        topics: Sequence[str],
        *,
        interval_s: float = 1.0,
        timeout_s: float = 3.0,
        failures_to_down: int = 2,
        on_change: Callable[[BrokerState], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.bus = bus
        self.topics = list(dict.fromkeys(topics))
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.failures_to_down = failures_to_down
        self.on_change = on_change
        self.clock = clock
        self.state = BrokerState(up=True, since=clock())
        self.remade = 0  # topics made again on a broker that lacked them
        self._failures = 0
        self._lock = threading.Lock()

    def check(self) -> BrokerState:
        """Ask the broker once; returns (and reports, when it changed) the state."""
        try:
            have = self.bus.ping(self.timeout_s)
            missing = [t for t in self.topics if t not in have]
            if missing:
                self.bus.ensure_topics(missing)
                self.remade += len(missing)
                log.warning("the broker lacked %d topic(s) (%s ...): made them again",
                            len(missing), missing[0])
        except (DeliveryError, Exception) as e:  # noqa: BLE001 - any failure is "no answer"
            self._failures += 1
            if self.state.up and self._failures >= self.failures_to_down:
                self._set(BrokerState(up=False, since=self.clock(), reason=str(e)[:300],
                                      outages=self.state.outages + 1))
            return self.state
        self._failures = 0
        if not self.state.up:
            down_for = self.clock() - self.state.since
            self._set(BrokerState(up=True, since=self.clock(),
                                  reason=f"answering again after {down_for:.0f} s",
                                  outages=self.state.outages))
        return self.state

    def _set(self, state: BrokerState) -> None:
        with self._lock:
            self.state = state
        if self.on_change is not None:
            self.on_change(state)

    def run(self, stop: threading.Event) -> None:
        """Check every ``interval_s`` until ``stop`` is set."""
        while not stop.is_set():
            started = self.clock()
            self.check()
            stop.wait(max(0.0, self.interval_s - (self.clock() - started)))

    def start(self, stop: threading.Event) -> threading.Thread:
        t = threading.Thread(target=self.run, args=(stop,), name="vigil-broker-watch",
                             daemon=True)
        t.start()
        return t
