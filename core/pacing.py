"""When a source partition asks Bytewax 0.21.1 to poll it again, so that it never spins.

Each activation of a partitioned input (``src/inputs.rs:415-530`` in v0.21.1) runs, per
partition: if the probe has reached the partition's epoch and its ``next_awake`` is due,
``next_batch`` then ``next_awake``; then, if the epoch's interval has elapsed since the
epoch started (the activation's start time at the previous snapshot), ``snapshot`` and
the move to the next epoch. The activation ends by asking to run again at the earliest
``next_awake`` (``:540-549``), at once if that time has passed.

After a move to epoch e+1 the probe is behind e+1 until everything downstream finished
epoch e; meanwhile the partition is not called, so the ``next_awake`` it returned just
*before* the snapshot stays in force. Once that time passes, the operator asks to run again
at once on every worker step: the worker thread busy-loops in Rust (no GIL) until the
probe catches up. With the partition's default (``None`` after a non-empty batch, a few
milliseconds when idle) that is the whole wait; in a cluster, or with ``-w 2`` when the
sink partitions that are slow to finish an epoch are on other workers, a core.

:class:`EpochPacer` prevents it without knowing the probe:

- **The epoch's end is scheduled.** ``snapshotted`` records ``boundary = now + interval``.
  Bytewax's own epoch started at the beginning of that same activation, earlier, so an
  activation that starts at or after ``boundary`` certainly ends the epoch. The pacer
  stops polls in the last ``guard`` before the boundary and asks to be woken at it.
- **At the boundary it holds.** In the activation that starts at or after the boundary
  (``polled`` sees it), ``next_awake`` returns ``now + hold``: the snapshot follows in the
  same activation, and the partition is not polled (nor spinning) for ``hold``.
- **The hold adapts to the wait.** The first ``polled`` after a snapshot shows how long
  the wait lasted when it outlasted the hold (the spin polls the moment the probe
  passes): the next hold is that wait plus 2 ms, up to ``max_hold``. When it did not, the
  wait was shorter than the hold, by an unknown amount, and the hold shrinks by a quarter.
  What this costs: when the hold outlasts the wait, items that arrive in between wait for
  the rest of it, once per epoch; and up to ``guard`` before each boundary.
- **The interval is learned** when not given: the shortest time between two snapshots
  (Bytewax snapshots at the first activation past the interval). Until the second
  snapshot, and after any ``snapshotted`` the pacer did not foresee (a wrong interval, an
  activation that ran long), the epoch is not paced; a hold that no snapshot followed
  lengthens the interval.

Sans-IO: every method takes the current wall-clock time (``time.time()``: Bytewax compares
``Utc::now()``), so it is tested without an engine.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

#: The smallest hold: below it the wait is too short to be worth an extra poll's delay.
_MIN_HOLD = 0.002
#: Added to an observed wait to give the next hold.
_SLACK = 0.002


class EpochPacer:
    """Decides a source partition's ``next_awake`` around the ends of its epochs.

    Call ``polled(now)`` first in ``next_batch``, return ``next_awake(now, delay)`` from
    ``next_awake`` (``delay``: what the partition would ask for on its own, ``None`` for
    at once), call ``snapshotted(now)`` in ``snapshot``. Build it in ``build_part`` (the
    first epoch starts then).
    """

    def __init__(
        self,
        now: float,
        epoch_interval: timedelta | None = None,
        *,
        hold: timedelta = timedelta(milliseconds=20),
        max_hold: timedelta = timedelta(milliseconds=200),
        guard: timedelta = timedelta(milliseconds=5),
    ) -> None:
        """``now``: the time ``build_part`` runs. ``epoch_interval``: Bytewax's (``-s``), learned if None.

        ``hold`` is the first epoch's hold; ``max_hold`` bounds what a long wait teaches it.
        """
        self._interval = epoch_interval.total_seconds() if epoch_interval is not None else None
        self._max_hold = max_hold.total_seconds()
        self._guard = guard.total_seconds()
        self._hold = min(self._max_hold, max(_MIN_HOLD, hold.total_seconds()))
        self._last_snapshot: float | None = None
        # The first epoch started when the partition was built, before ``now``.
        self._boundary: float | None = now + self._interval if self._interval is not None else None
        self._ending = False  # this activation started at or after the boundary
        self._held = False  # the last next_awake returned a hold
        self._delay = 0.0  # what the last next_awake asked for, in seconds from then
        self._snapshot_at: float | None = None  # set until the first poll after a snapshot
        #: Epochs whose wait outlasted the hold (the partition spun for the rest of it).
        self.spins = 0
        #: Holds that no snapshot followed (the interval was too short).
        self.misses = 0

    @property
    def hold(self) -> float:
        """The hold the next epoch's end will use, in seconds."""
        return self._hold

    def polled(self, now: float) -> None:
        """``next_batch`` was called at ``now``."""
        if self._snapshot_at is not None:
            waited = now - self._snapshot_at
            self._snapshot_at = None
            if waited > self._delay + _SLACK:
                self.spins += 1
                self._hold = min(self._max_hold, waited + _SLACK)
            else:
                self._hold = max(_MIN_HOLD, self._hold * 0.75)
        elif self._held:
            # A hold with no snapshot after it: the engine's epoch is longer than thought.
            self.misses += 1
            if self._interval is not None and self._last_snapshot is not None:
                self._interval = max(self._interval, now - self._last_snapshot)
                self._boundary = now  # ``last snapshot + interval``, without rounding
        self._held = False
        self._ending = self._boundary is not None and now >= self._boundary

    def next_awake(self, now: float, delay: float | None) -> datetime | None:
        """The ``next_awake`` to return; ``delay`` is the partition's own wish (seconds, or None)."""
        if self._ending:
            # Bytewax snapshots right after this call; the next epoch waits for the probe.
            self._held = True
            self._delay = self._hold
            return datetime.fromtimestamp(now + self._hold, UTC)
        wake = now + (delay or 0.0)
        if self._boundary is not None and wake >= self._boundary - self._guard:
            wake = max(wake, self._boundary)  # not just before the boundary: at it
        self._delay = wake - now
        if delay is None and wake == now:
            return None
        return datetime.fromtimestamp(wake, UTC)

    def snapshotted(self, now: float) -> None:
        """``snapshot`` was called at ``now`` (Bytewax's next epoch starts in this activation)."""
        if self._last_snapshot is not None:
            gap = now - self._last_snapshot
            if self._interval is None or (not self._ending and gap < self._interval - self._guard):
                # Learned; or the engine's epoch is clearly shorter than thought (a snapshot
                # late in its activation can make a gap look a little short: not that).
                self._interval = gap
        self._last_snapshot = now
        self._snapshot_at = now
        self._boundary = now + self._interval if self._interval is not None else None
        self._ending = False
        self._held = False
