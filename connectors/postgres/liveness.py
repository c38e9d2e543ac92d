"""A session's timers: when to send a status update, when silence means a dead connection, when
to warn of a stall. Sans-IO: it is told the time and what happened, and says what to do.

The rules (README, "The Postgres source": status updates): a status update
goes out at least every ``status_interval``, and soon after the confirmed position moves
(but at most every :data:`CONFIRM_GAP`); one sent after a status interval of silence asks
for a reply. Liveness is judged on any message, never on data: silence past
``wal_sender_timeout/2 + 3 status intervals`` despite those pings makes the connection
suspect (the session then asks the server whether its walsender is busy). WAL standing still
for :data:`STALL_WARNING` while connected and reading is worth a warning, not a restart.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

#: The least time between two status updates sent only because the confirmed LSN moved.
CONFIRM_GAP: Final = 0.1
#: walEnd standing still this long (seconds) while connected is logged as a warning.
STALL_WARNING: Final = 300.0


@dataclass(frozen=True, slots=True)
class Tick:
    """What to do now: send a status update (asking for a reply or not), check whether a
    silent connection is dead, warn of WAL standing still for ``stalled`` seconds."""

    send: bool
    reply: bool
    suspect: bool
    stalled: float | None


class Liveness:
    """One session's timers (times are ``time.monotonic()`` seconds)."""

    def __init__(self, now: float, received: int, status_interval: float, wal_sender_timeout: float,
                 *, watch_stalls: bool = True) -> None:
        """``watch_stalls``: warn of WAL standing still (only meaningful with heartbeats written)."""
        self.interval = status_interval
        self.dead_after = wal_sender_timeout / 2 + 3 * status_interval
        self._watch_stalls = watch_stalls
        self._heard = now  # when the server last sent anything
        self._next_status = self._last_sent = 0.0
        self._progress_lsn, self._progress_at = received, now  # walEnd's last move

    def heard(self, now: float) -> None:
        """The server sent something (or the session was not listening: that is not silence)."""
        self._heard = now

    def tick(self, now: float, received: int, confirm_unsent: bool, listening: bool) -> Tick:
        """The loop's turn at ``now``, having received up to ``received``; ``confirm_unsent``:
        the confirmed position moved since the last status update; ``listening``: the session
        reads (its buffer has room)."""
        silent = now - self._heard
        stalled = None
        if received != self._progress_lsn:
            self._progress_lsn, self._progress_at = received, now
        elif self._watch_stalls and listening and now - self._progress_at > STALL_WARNING:
            stalled, self._progress_at = now - self._progress_at, now
        send = now >= self._next_status or (confirm_unsent and now - self._last_sent >= CONFIRM_GAP)
        return Tick(send, send and silent > self.interval, silent > self.dead_after, stalled)

    def sent(self, now: float) -> None:
        """A status update went out on the loop's turn."""
        self._last_sent, self._next_status = now, now + self.interval

    def wake_by(self, confirm_unsent: bool) -> float:
        """When the loop must look again at the latest, whatever arrives."""
        if confirm_unsent:
            return min(self._next_status, self._last_sent + CONFIRM_GAP)
        return self._next_status

    def silent_for(self, now: float) -> float:
        return now - self._heard
