"""One slot's positions and the rules that move them: sans-IO, like the decoder.

Every LSN that decides exactly-once and the slot's movement lives in one
:class:`SlotPosition`: where the next session starts, how far the walsender sent, what was
emitted to Bytewax, the epoch ends that may be confirmed, the confirmed position and what
the last status update told the server. Its methods are the rules; they take events
(a position marker or change emitted, the end of a batch, an epoch end, an epoch complete
downstream, a session's start) and return what to do. Nothing here reads a socket, a clock
or a lock: the partition (``source.py``) and the session (``session.py``) are the shells
that carry bytes and call it.

Two threads share it, each field with one writer: the reader thread writes
:attr:`~SlotPosition.resume`, :attr:`~SlotPosition.received` and :attr:`~SlotPosition.sent`;
the Bytewax worker writes everything else. Ints are read across threads whole.
The rules themselves are in the README's design section ("When the slot moves").
"""

from __future__ import annotations

from collections import deque
from typing import TypedDict

from connectors.postgres.decoder import ResumePoint
from connectors.postgres.protocol import status_update

#: How many shares of the confirm delay keep a waiting position each: what bounds the
#: positions kept (~this many) and how much later than the delay one is confirmed (a share).
_BUCKETS = 64


class Emitted(TypedDict):
    """How far the partition emitted: the snapshot's position fields (plain data)."""

    lsn: int
    commit_lsn: int | None
    commit_idx: int


class SlotPosition:
    """Where one slot stands, for the session that reads it and the partition that emits it."""

    __slots__ = ("_delay", "_delayed", "_dirty", "_epoch_ends", "_settled", "_unconfirmed", "commit_idx",
                 "commit_lsn", "confirm_after", "confirmed", "lsn", "received", "resume", "sent", "stop_at")

    def __init__(self, resume: ResumePoint, *, confirm_after: int = 0, stop_at: int | None = None,
                 confirm_delay: float = 0.0) -> None:
        """``confirm_after``: confirm nothing up to this LSN (what a previous run may have
        published past the slot: its sinks' replay horizon); ``stop_at``: the partition ends
        once everything committed before it was emitted; ``confirm_delay``: seconds a
        position durable downstream waits before it is confirmed (the sinks'
        ``confirm_delay_ms``: what their servers may still lose)."""
        # -- the reader thread's ------------------------------------------------------
        #: Where the next session starts: right after everything a session handed on.
        self.resume = resume
        #: The furthest WAL position received from the walsender (the status update's ``write``).
        self.received = resume.lsn
        #: The ``flush`` position the last status update carried (-1: none sent yet).
        self.sent = -1
        # -- the worker's -------------------------------------------------------------
        #: Emitted: every transaction committed before ``lsn`` whole, and of the one at
        #: ``commit_lsn`` (None: none open) the changes up to ``commit_idx``. The partition's
        #: loop writes ``commit_lsn``/``commit_idx`` itself for each change it emits (a method
        #: call there would cost ~15 % of the loop); :meth:`marker` closes the transaction.
        self.lsn, self.commit_lsn, self.commit_idx = resume.lsn, resume.commit_lsn, resume.commit_idx
        #: Everything before it is durable downstream: the status update's ``flush``.
        self.confirmed = resume.lsn
        self.confirm_after = confirm_after
        self.stop_at = stop_at
        #: Epoch ends not yet confirmable because a backfill's floor is below them.
        self._epoch_ends: deque[int] = deque([resume.lsn])
        #: The last epoch end, to confirm once that epoch is complete downstream.
        self._unconfirmed: int | None = None
        self._dirty = False  # changes emitted since the last epoch end
        self._delay = confirm_delay
        #: Positions durable downstream, waiting out the confirm delay: [first durable at,
        #: last durable at, position], oldest first. Positions that become durable within
        #: :data:`_BUCKETS`-th of the delay share an entry, so it holds ~_BUCKETS of them.
        self._delayed: deque[list[float]] = deque()
        self._settled = False  # every change emitted so far is covered by a confirmed epoch

    # -- the session's events -----------------------------------------------------------

    def session_start(self, server_confirmed: int) -> int | None:
        """START_REPLICATION reported the slot's confirmed position: where the decoder must
        start instead of :attr:`resume`, when the server is ahead of it (None: it is not).
        Ahead of a :attr:`resume` past 0, someone else confirmed the slot beyond what walflow
        made durable: the changes in between are gone from it."""
        self.received = max(self.received, server_confirmed)
        return server_confirmed if server_confirmed > self.resume.lsn else None

    def heard(self, received: int) -> None:
        """The session received WAL up to ``received`` (after each burst it handed on)."""
        self.received = max(self.received, received)

    def status(self, received: int, reply: bool = False) -> bytes:
        """The standby status update to send now, having received up to ``received``."""
        self.heard(received)
        flush = self.confirmed
        self.sent = flush
        return status_update(self.received, flush, reply)

    @property
    def confirm_unsent(self) -> bool:
        """The confirmed position moved since the last status update: send one soon."""
        return self.confirmed != self.sent

    def session_end(self, resume: ResumePoint) -> None:
        """A session ended: the next one starts at ``resume``, right after all it handed on."""
        self.resume = resume

    # -- the partition's events ---------------------------------------------------------

    def marker(self, lsn: int) -> None:
        """Everything before ``lsn`` was emitted (a position marker from the stream)."""
        self.lsn = max(self.lsn, lsn)
        if self.commit_lsn is not None and lsn > self.commit_lsn:
            self.commit_lsn, self.commit_idx = None, -1  # that transaction is complete

    def batch_end(self, emitted: bool, floor: int | None, now: float = 0.0) -> bool:
        """A batch was handed to Bytewax (``emitted``: with changes in it) at ``now``
        (monotonic seconds). True: :attr:`confirmed` moved — nothing is in flight and the
        position moved over WAL with nothing to publish (keepalive walEnd), so no epoch
        needs to pass; or a position waited out the confirm delay."""
        moved = self._release(now)
        if emitted:
            self._dirty, self._settled = True, False
            return moved
        if not self._settled:
            return moved
        return self._confirm(self._confirmable(self.lsn, floor), now) or moved

    def reads_emitted(self) -> None:
        """A backfill's reads were handed to Bytewax: they are in flight like changes."""
        self._dirty, self._settled = True, False

    def epoch_end(self, floor: int | None) -> Emitted:
        """The partition is snapshotted at the end of an epoch: what the snapshot holds.

        Only epochs that end between transactions are confirmed later: then every change in
        JetStream at or after the confirmed LSN came from a later epoch, which is what the
        sinks' startup check for already-published changes relies on."""
        if self.commit_lsn is None:
            self._epoch_ends.append(self.lsn)
            self._unconfirmed = self._confirmable(self.lsn, floor)
        self._dirty = False
        return {"lsn": self.lsn, "commit_lsn": self.commit_lsn, "commit_idx": self.commit_idx}

    def epoch_complete(self, now: float = 0.0) -> bool:
        """Bytewax called the partition again (at ``now``, monotonic seconds): the previous
        epoch is complete downstream, its snapshot position durable. True: :attr:`confirmed`
        moved (wake the session)."""
        if self._unconfirmed is None:
            return False
        moved = self._confirm(self._unconfirmed, now)
        self._unconfirmed = None
        self._settled = not self._dirty
        return moved

    @property
    def finished(self) -> bool:
        """Everything committed before ``stop_at`` was emitted (never, without one)."""
        return self.stop_at is not None and self.lsn >= self.stop_at and self.commit_lsn is None

    # -- rules ------------------------------------------------------------------------------

    @property
    def durable(self) -> int:
        """Everything before it is durable downstream: :attr:`confirmed`, or ahead of it by
        what waits out the confirm delay."""
        return int(self._delayed[-1][2]) if self._delayed else self.confirmed

    def _confirm(self, lsn: int, now: float) -> bool:
        """Confirm ``lsn``, once the confirm delay has passed since ``now``, unless a previous
        run may have published past it, or it is not new. True: :attr:`confirmed` moved."""
        if lsn <= self.confirm_after or lsn <= self.durable:
            return False
        if self._delay <= 0:
            self.confirmed = lsn
            return True
        delayed = self._delayed
        if delayed and now - delayed[-1][0] < self._delay / _BUCKETS:
            delayed[-1][1:] = [now, lsn]  # a later position in the same share: it waits from now
        else:
            delayed.append([now, now, lsn])
        return False

    def _release(self, now: float) -> bool:
        """Confirm the positions durable for at least the confirm delay at ``now``."""
        delayed, moved = self._delayed, False
        while delayed and delayed[0][1] <= now - self._delay:
            self.confirmed = int(delayed.popleft()[2])
            moved = True
        return moved

    def _confirmable(self, lsn: int, floor: int | None) -> int:
        """``lsn``, or less while a backfill runs: the slot keeps its newest signal (``floor``,
        ``backfill.py``). Then the latest epoch end at or before that signal, never a position
        inside an epoch (which the sinks' startup scan relies on); 0 if there is none yet."""
        ends = self._epoch_ends
        if floor is None:  # lsn is an epoch end, or nothing is in flight: where a backfill's wait may start
            ends.clear()
            ends.append(lsn)
            return lsn
        while len(ends) > 1 and ends[1] <= floor:
            ends.popleft()
        return ends[0] if ends and ends[0] <= floor else 0
