"""The publisher's window, without I/O: the ``HPUB`` commands of a batch, the row fence, the match of an ack.

What :class:`connectors.nats.publisher.AckPublisher` does for every message — number it under
its reply inbox, hold it back while its row has a message in flight, write its command; and
for every ack, find the message by the ack's subject (its reply subject) and read the stream
sequence — is here, on plain data, so that it can be compiled with the hot path
(``core/compiled.py``) and tested without a server. When to send, wait, settle and re-send
stays the publisher's.
"""

from __future__ import annotations

import re
import time
from collections import deque
from collections.abc import Callable
from typing import Final

from connectors.nats.frames import decimal, digits_end, is_space
from core.errors import PublishError, PublishRefused
from core.message import Message
from core.metrics import HistogramBatch

#: An ``HPUB`` command, as the NATS protocol spells it, is ``HPUB``, its subject, its reply
#: subject (:meth:`Window.commands`), then this: the header block's size and the whole size,
#: and the header block up to the ``Nats-Msg-Id``'s value. Then that value, the message's own
#: header lines (none: nothing), the block's end, the payload, the command's end. A batch's
#: commands are pieces of one ``bytes.join``: the payload is copied once, into the block.
_SIZES: Final = b" %d %d\r\nNATS/1.0\r\nNats-Msg-Id: "
#: The header block's size without the id (nor a message's own lines).
HEADERS_SIZE: Final = len(b"NATS/1.0\r\nNats-Msg-Id: \r\n\r\n")
_SEQ: Final = b'"seq":'
#: An ack that carries an error object (a stream may well be named "error": match the key).
_ERROR: Final = re.compile(rb'"error"\s*:')


class InFlight:
    """One message in the window, from its first send until it is stored or given up on."""

    __slots__ = ("error", "first_sent", "floor_seq", "message", "seq")

    def __init__(self, message: Message, first_sent: float, floor_seq: int) -> None:
        self.message = message
        #: When the message was first sent, and its partition's last acked sequence then: a
        #: message stored but unacknowledged has a higher sequence than that.
        self.first_sent = first_sent
        self.floor_seq = floor_seq
        self.seq = 0  # the stream sequence, once acknowledged
        self.error: PublishError | None = None

    @property
    def done(self) -> bool:
        return self.seq > 0 or self.error is not None

    @property
    def published_on(self) -> str:
        return self.message.subject.decode()

    def again(self) -> InFlight:
        """A fresh entry for a re-send of the same message, first sent when this one was."""
        return InFlight(self.message, self.first_sent, self.floor_seq)


#: How a window tells its publisher of an ack (:meth:`Window.on_ack`).
Notify = Callable[[InFlight, bool, int, bytes, bytes | None], None]


class Window:
    """One publisher's messages in flight and held back, and the reply subjects its acks name them by.

    ``inflight`` holds the window in sending order; ``waiting`` each sent message by its reply
    subject, until its ack; ``rows`` each row's message in flight; ``held`` (in order) the messages
    whose row has one in flight or held, ``held_rows`` how many each row has held."""

    def __init__(self, reply_prefix: bytes, counts: dict[tuple[str, str], int] | None = None,
                 latency: HistogramBatch | None = None, notify: Notify | None = None) -> None:
        """``counts`` and ``latency``: where the publisher's metrics count the stored messages,
        by their labels, and observe their commit → ack latency (:meth:`count`). ``notify``: the
        publisher, told of the acks it must act on (:meth:`on_ack`)."""
        #: Every ack's subject: this prefix (the inbox and a dot) and the message's token, a
        #: number counted up; ``waiting`` is keyed by that subject, as the ack comes back on it.
        self.reply_prefix = reply_prefix
        self.token = 0
        self.waiting: dict[bytes, InFlight] = {}
        self.rows: dict[int, InFlight] = {}
        self.held: list[InFlight] = []
        self.held_rows: dict[int, int] = {}
        self.inflight: deque[InFlight] = deque()
        self.counts: dict[tuple[str, str], int] = {} if counts is None else counts
        self.latency = latency
        self.notify = notify
        #: The entry whose ack the publisher waits for (None: none).
        self.awaited: InFlight | None = None

    def next_reply(self) -> bytes:
        """A reply subject no message of this window had: the prefix and the next token."""
        self.token += 1
        return self.reply_prefix + str(self.token).encode()

    def count(self, message: Message, now: float) -> None:
        """``message`` was stored at ``now`` (Unix seconds): counted by its labels, and its commit
        → ack latency observed (a backfill's read has no commit time). Here, once per ack, for
        the same reason as the rest of the window: it is compiled."""
        labels = message.labels
        self.counts[labels] = self.counts.get(labels, 0) + 1
        if self.latency is not None and (committed := message.commit_ts):
            self.latency.observe(now - committed)

    def commands(self, entries: list[InFlight], max_payload: int) -> tuple[bytes, int, int]:
        """The ``HPUB`` commands of ``entries`` as one block, each put in the window as it is
        written, up to one too large to send (its ``error`` is :func:`_too_large`'s; nothing after
        it is sent, nor put in the window); one whose row has a message in flight or held is held
        instead. Returns the block, how many commands it holds, and how many entries were put in
        the window (one more than it holds when one was too large)."""
        waiting, rows = self.waiting, self.rows
        held, held_rows, inflight = self.held, self.held_rows, self.inflight
        pieces: list[bytes] = []
        sent = taken = 0
        for entry in entries:
            message = entry.message
            row = message.row
            if row:
                if row in rows or row in held_rows:
                    held.append(entry)
                    held_rows[row] = held_rows.get(row, 0) + 1
                    continue
                rows[row] = entry
            inflight.append(entry)
            taken += 1
            msg_id, payload, extra = message.msg_id.encode(), message.payload, message.headers
            headers = HEADERS_SIZE + len(msg_id) + len(extra)
            size = headers + len(payload)
            if size > max_payload:
                entry.error = _too_large(size, max_payload)
                break
            reply = self.next_reply()
            waiting[reply] = entry
            sent += 1
            pieces += (b"HPUB ", message.subject, b" ", reply, _SIZES % (headers, size), msg_id, b"\r\n", extra,
                       b"\r\n", payload, b"\r\n")
        return b"".join(pieces), sent, taken

    def on_ack(self, subject: bytes, data: bytes, headers: bytes | None) -> None:
        """The handler of the publisher's acks, read straight from the wire: each is matched and
        counted here (:meth:`acked`), and ``notify`` hears only of those it must act on — a
        failure, the ack it waits for (:attr:`awaited`), a row fence lifted while that row has
        messages held — with the ack's entry, whether it was stored, the row, its data and headers."""
        entry, stored, unfenced = self.acked(subject, data)
        if entry is None or self.notify is None:
            return
        if not stored or entry is self.awaited or (unfenced and unfenced in self.held_rows):
            self.notify(entry, stored, unfenced, data, headers)

    def acked(self, subject: bytes, data: bytes) -> tuple[InFlight | None, bool, int]:
        """The entry an ack on ``subject`` is for, out of ``waiting`` (None: none waits for it, a
        late ack of a message given up on and re-sent, or not one of ours); whether it was
        stored (its ``seq`` is then set; if not, the caller reads the error the ack carries);
        and the row whose fence it lifted (0: none), whose held messages may go now."""
        entry = self.waiting.pop(subject, None)
        if entry is None:
            return None, False, 0
        seq = sequence(data)
        # find, not ``in``: bytes ``in`` raises and clears a TypeError per call (connectors/postgres/types.py)
        if seq < 0 or (data.find(b'"error"') >= 0 and _ERROR.search(data) is not None):
            return entry, False, 0
        entry.seq = seq
        self.count(entry.message, time.time())
        row = entry.message.row
        if row and self.rows.get(row) is entry:
            del self.rows[row]  # the row's next message may go: now, not at the next batch
            return entry, True, row
        return entry, True, 0


def sequence(data: bytes) -> int:
    r"""The number of an ack's first ``"seq":`` key that has one, as the pattern
    ``"seq":\s*(\d+)`` finds it; -1 if none has. Read by hand: once per ack, a regex's search,
    match object and group cost more than the ack's whole handling otherwise."""
    size, at = len(data), data.find(_SEQ)
    while at >= 0:
        start = at + len(_SEQ)
        while start < size and is_space(data[start]):
            start += 1
        end = digits_end(data, start, size)
        if end > start:
            return decimal(data, start, end)
        at = data.find(_SEQ, at + 1)
    return -1


def _too_large(size: int, max_payload: int) -> PublishError:
    """A message the server would drop the connection over: refused here, by name."""
    return PublishRefused(f"the message is larger than the server's max_payload ({size} > {max_payload} bytes with "
                          "its headers)")
