"""When a source partition asks Bytewax 0.21.1 to poll it again, so that it never spins.

After a snapshot moves the partition to its next epoch, Bytewax does not call it until
everything downstream has finished the previous epoch, and once the ``next_awake`` it returned
before the snapshot has passed, the worker busy-loops in Rust (no GIL) until then: up to a
core, in a cluster or with ``-w 2``. :class:`EpochPacer` prevents that without knowing the
probe:

- ``snapshotted`` schedules the epoch's end (``boundary = now + interval``); polls stop in the
  last ``guard`` before it, and the pacer asks to be woken at it.
- In the activation that starts at or after the boundary (``polled`` sees it), ``next_awake``
  returns ``now + hold``: the snapshot follows in that activation, and the partition is not
  polled, nor spinning, for ``hold``.
- The hold adapts to the wait it covers, up to ``max_hold``; the interval is learned when not
  given (Bytewax's ``-s``). Until it is known, and after a snapshot the pacer did not foresee,
  the epoch is not paced.

The cost: items that arrive during a hold that outlasts the wait wait for the rest of it, once
per epoch, and for up to ``guard`` before each boundary.

Sans-IO: every method takes the current wall-clock time (``time.time()``: Bytewax compares
``Utc::now()``), so it is tested without an engine. How Bytewax schedules a partitioned input,
and the hold's rules in full: ``docs/design.md``, *core/pacing.py*.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

#: The smallest hold: below it the wait is too short to be worth an extra poll's delay.
_MIN_HOLD = 0.002
#: Added to an observed wait to give the next hold.
_SLACK = 0.002
#: A poll this fraction of the hold after it (plus ``_SLACK``) is the scheduler waking the
#: thread late on a loaded machine, not a wait that outlasted the hold: it is no spin.
_LATE = 0.05


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
            if waited > self._delay * (1 + _LATE) + _SLACK:
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
