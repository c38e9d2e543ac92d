"""What one retrying component says about an outage: once, not once per attempt.

A Postgres crash or restart ends the session with one error, then refuses a reconnect or two
while the server recovers (``the database system is not yet accepting connections``). The
first failure of an outage is a warning; a failure of another kind (a slot now held by
someone else after a lost connection) is one too, and so is one every :data:`REPEAT_EVERY`
seconds of a long outage; the attempts in between are logged at debug. When the component
works again, one info line says after how long and how many failed attempts.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Final

#: In an outage of one kind, a warning at most this often (seconds).
REPEAT_EVERY: Final = 30.0


class OutageLog:
    """The log of one component's outages (sans-IO but for ``logger``; ``clock`` is injectable)."""

    def __init__(self, logger: logging.Logger, clock: Callable[[], float] = time.monotonic) -> None:
        self._log = logger
        self._clock = clock
        self._began: float | None = None  # when the outage began, while there is one
        self._kind = ""
        self._warned = 0.0
        self.attempts = 0  # failed attempts in the outage so far

    @property
    def ongoing(self) -> bool:
        return self._began is not None

    def failed(self, kind: str, message: str, *args: object) -> None:
        """One failed attempt of kind ``kind`` (``message % args`` says what happened and what comes next)."""
        now = self._clock()
        if self._began is None:
            self._began, loud = now, True
        else:
            loud = kind != self._kind or now - self._warned >= REPEAT_EVERY
        self.attempts += 1
        self._kind = kind
        if loud:
            self._warned = now
            self._log.warning(message, *args)
        else:
            self._log.debug(message, *args)

    def recovered(self, what: str) -> None:
        """It works again: one info line (``what`` names it) if there was an outage."""
        if self._began is None:
            return
        self._log.info("%s again after %.1fs (%d failed attempt%s)", what, self._clock() - self._began,
                       self.attempts, "" if self.attempts == 1 else "s")
        self._began, self._kind, self.attempts = None, "", 0
