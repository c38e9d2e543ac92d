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


class Emitted(TypedDict):
    """How far the partition emitted: the snapshot's position fields (plain data)."""

    lsn: int
    commit_lsn: int | None
    commit_idx: int


class SlotPosition:
    """Where one slot stands, for the session that reads it and the partition that emits it."""

    __slots__ = ("_dirty", "_epoch_ends", "_settled", "_unconfirmed", "commit_idx", "commit_lsn",
                 "confirm_after", "confirmed", "lsn", "received", "resume", "sent", "stop_at")

    def __init__(self, resume: ResumePoint, *, confirm_after: int = 0, stop_at: int | None = None) -> None:
        """``confirm_after``: confirm nothing up to this LSN (what a previous run may have
        published past the slot: its sinks' replay horizon); ``stop_at``: the partition ends
        once everything committed before it was emitted."""
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

    def batch_end(self, emitted: bool, floor: int | None) -> bool:
        """A batch was handed to Bytewax (``emitted``: with changes in it). True: the slot may
        be confirmed at once — nothing is in flight and the position moved over WAL with
        nothing to publish (keepalive walEnd), so no epoch needs to pass."""
        if emitted:
            self._dirty, self._settled = True, False
            return False
        if not self._settled:
            return False
        return self._confirm(self._confirmable(self.lsn, floor))

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

    def epoch_complete(self) -> bool:
        """Bytewax called the partition again: the previous epoch is complete downstream, its
        snapshot position durable. True: :attr:`confirmed` moved (wake the session)."""
        if self._unconfirmed is None:
            return False
        moved = self._confirm(self._unconfirmed)
        self._unconfirmed = None
        self._settled = not self._dirty
        return moved

    @property
    def finished(self) -> bool:
        """Everything committed before ``stop_at`` was emitted (never, without one)."""
        return self.stop_at is not None and self.lsn >= self.stop_at and self.commit_lsn is None

    # -- rules ------------------------------------------------------------------------------

    def _confirm(self, lsn: int) -> bool:
        """Confirm ``lsn`` unless a previous run may have published past it, or it is not new."""
        if lsn > self.confirm_after and lsn > self.confirmed:
            self.confirmed = lsn
            return True
        return False

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
