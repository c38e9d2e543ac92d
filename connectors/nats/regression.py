"""A stream that went back in time: JetStream lost messages it had acknowledged.

JetStream acknowledges a publish before it syncs it to disk (``sync_interval``, 2 minutes by
default), so a server that crashes, or a store put back from a copy, can come back without
messages it acknowledged — and its duplicate window forgets their ids too. Each publisher
remembers the highest sequence acknowledged to it and that message's id (:class:`Acked`);
:func:`look` compares them with the stream: its last sequence below ours, or another message
at ours, is a :class:`Regression`. The publisher looks after every reconnect before it sends
anything again, when it resumes from a snapshot, and every :data:`LOOK_EVERY` seconds.

The repair is the slot's: its confirmed position trails the acks by the confirm delay
(``destination.confirm_delay_ms``), so what the stream lost within it is still in the WAL.
walflow starts itself again (:meth:`core.runtime.Runtime.restart`) and the start's replay scan
(``replay.py``) publishes exactly what the stream no longer holds. What was acknowledged longer
ago than the delay may be past the slot: :meth:`Regression.line` says so.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import asdict, dataclass
from typing import Any, Final

from nats.aio.client import Client
from nats.js.errors import NotFoundError

#: Seconds between two looks at the stream while publishing (besides every reconnect).
LOOK_EVERY: Final = 10.0
#: A lost message acknowledged this close to the confirm delay ago may have been confirmed
#: past meanwhile (the status update in flight, the restart's own time): said to be lost.
_MARGIN: Final = 5.0


@dataclass(frozen=True, slots=True)
class Acked:
    """The highest stream sequence acknowledged to one publisher, and the id of that message."""

    seq: int
    msg_id: str
    #: When the stream it was stored in was created, as the last look found (None: not looked
    #: yet): a stream deleted and created again under the same name is another stream.
    created: str | None = None


class AckTimes:
    """Acknowledged messages sampled about once a second (sequence, id, when), bounded: where a
    lost stretch starts, and so how long ago its first message was acknowledged at most."""

    def __init__(self, keep: int = 4096) -> None:
        self._samples: deque[tuple[int, str, float]] = deque(maxlen=keep)

    def acked(self, seq: int, msg_id: str, now: float) -> None:
        samples = self._samples
        if not samples or now - samples[-1][2] >= 1.0:
            samples.append((seq, msg_id, now))

    def samples(self) -> list[tuple[int, str, float]]:
        return list(self._samples)


@dataclass(frozen=True, slots=True)
class Regression:
    """A stream found holding less than it acknowledged to a publisher."""

    sink: str
    stream: str
    acked_seq: int
    #: The stream's last sequence when it was looked at.
    stream_last: int
    #: The newest sampled acknowledged message the stream still holds (0: none of them): the
    #: loss starts after it.
    kept_seq: int
    #: Seconds before the look that the message at ``kept_seq`` was acknowledged: every lost
    #: one was acknowledged after it (None: no sample is held).
    age: float | None
    #: The confirm delay then, in seconds.
    confirm_delay: float
    at: float

    @property
    def missing(self) -> int:
        """How many acknowledged messages the stream lacks at most (of this publisher's and
        others' in the same stretch): between what it still holds and what it acknowledged."""
        return self.acked_seq - self.kept_seq

    @property
    def repairable(self) -> bool:
        """Whether the slot still holds everything lost: it was all acknowledged within the delay."""
        return self.age is not None and self.age < self.confirm_delay - _MARGIN

    def line(self) -> str:
        """The one line an operator reads."""
        if self.stream_last < self.acked_seq:
            what = f"it ends at sequence {self.stream_last:,} but had acknowledged sequence {self.acked_seq:,}"
        else:
            what = (f"sequence {self.acked_seq:,} holds another message than the one it acknowledged there (it went "
                    "back and was written again since)")
        head = (f"JetStream stream '{self.stream}' lost messages it had acknowledged to sink '{self.sink}': {what}, "
                f"up to {self.missing:,} message(s) after sequence {self.kept_seq:,}")
        if self.repairable:
            assert self.age is not None
            return (f"{head}; all acknowledged within the last {self.age:.0f} s, inside destination.confirm_delay_ms "
                    f"({self.confirm_delay:.0f} s), so the slot still holds them: walflow restarts from the slot's "
                    "confirmed position and publishes again what the stream no longer has")
        when = "at an unknown time" if self.age is None else f"up to {self.age:.0f} s ago"
        return (f"{head}; some were acknowledged {when}, longer ago than destination.confirm_delay_ms "
                f"({self.confirm_delay:.0f} s), so the slot may have been confirmed past them: those changes are LOST "
                "and cannot be published again (backfill the affected tables to restore their rows). walflow restarts "
                "from the slot's confirmed position and publishes again what the slot still holds. Set "
                "confirm_delay_ms to at least the servers' sync_interval (2 min by default), or sync_interval: always")

    def as_json(self) -> dict[str, Any]:
        return {**asdict(self), "missing": self.missing, "repairable": self.repairable}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Regression:
        return cls(**{name: data[name] for name in cls.__dataclass_fields__})


async def look(nc: Client, sink: str, stream: str, acked: Acked, ack_times: AckTimes,
               confirm_delay: float) -> tuple[Regression | None, str | None]:
    """Whether ``stream`` still holds the message ``acked`` names: a :class:`Regression` if not,
    and when the stream was created (a stream created since ``acked.created`` is a new one,
    which lost nothing: the old one was deleted, and what it held with it).

    A sequence below the stream's first is no loss (its limits removed it, or a purge), nor a
    message deleted from the middle (an operator's act); the stream ending before it, or
    another id there, is. Where the loss starts is found among the samples (a stream that
    went back lost a tail: the samples it still holds come first)."""
    js = nc.jetstream()
    try:
        info = await js.stream_info(stream)
    except NotFoundError:  # deleted: the next publish meets "no responders" and sets it up again
        return None, None
    state, created = info.state, None if info.created is None else str(info.created)
    if not acked.seq or (acked.created is not None and created != acked.created):
        return None, created
    if await _holds(nc, stream, acked.seq, acked.msg_id, state.first_seq, state.last_seq):
        return None, created
    now = time.monotonic()
    samples = [sample for sample in ack_times.samples() if sample[0] < acked.seq]
    low, high = 0, len(samples)  # samples[:low] are held, samples[high:] are not
    while low < high:
        middle = (low + high) // 2
        seq, msg_id, _ = samples[middle]
        if await _holds(nc, stream, seq, msg_id, state.first_seq, state.last_seq):
            low = middle + 1
        else:
            high = middle
    kept_seq, age = (samples[low - 1][0], now - samples[low - 1][2]) if low else (0, None)
    return Regression(sink, stream, acked.seq, state.last_seq, kept_seq, age, confirm_delay, time.time()), created


async def _holds(nc: Client, stream: str, seq: int, msg_id: str, first: int, last: int) -> bool:
    """Whether the stream holds the message ``msg_id`` at ``seq``, or lost none there: gone under
    its first sequence by its limits, or deleted from its middle."""
    if seq > last:
        return False
    if seq < first:
        return True
    try:
        msg = await nc.jetstream().get_msg(stream, seq)
    except NotFoundError:
        return True
    return bool((msg.headers or {}).get("Nats-Msg-Id", "") == msg_id)
