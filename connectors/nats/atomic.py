"""Publishing whole transactions: JetStream atomic batches (``transactions: atomic``).

Render hands the partition its messages with :data:`core.events.TRANSACTION_END` after each
unit (a transaction's messages, a backfill's read alone). Units go to the stream as atomic
batches (``Nats-Batch-Id``, ``Nats-Batch-Sequence``, ``Nats-Batch-Commit: 1`` on the last,
which alone carries a reply subject and is answered ``{"seq", "count", …}``), which JetStream
makes visible all at once or not at all:

- consecutive whole units share a batch, up to :data:`MAX_MSGS` messages and
  :data:`MAX_BYTES` bytes: a reader sees each of them whole (and several together);
- a unit larger than that goes as consecutive batches of its own, of :data:`MAX_MSGS`
  messages (fewer where :data:`MAX_BYTES` ends one first), the rest in the last. Each of its
  messages carries ``Walflow-Transaction-Batch: <k>`` (1-based), and those of its last batch
  also ``Walflow-Transaction-Batches: <n>``: a consumer knows it has the whole transaction
  when it has read the batch that says how many there are. A batch is sent only once more of
  the unit is known to follow, so the last one is always the one that says so.

One batch is in flight at a time (what makes the order of units the stream's order, also
through a failure: nothing after a batch is sent before the batch is stored). When one is
not acknowledged — a timeout, a lost connection, an error JetStream may retry — it may have
been stored all the same: the stream is asked which of its ids it holds (a batch holding a
stored id is refused whole, code 10201, so it is never sent again with one) and what is not
stored is sent again as a new batch. The open unit's messages stay here across a snapshot:
the source resumes a flow from the open transaction's start (``connectors/postgres/source.py``),
and the slot is never confirmed inside one.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from base64 import urlsafe_b64encode
from typing import Any, Final

from connectors.nats.natspy import WalflowClient
from connectors.nats.publisher import AckPublisher
from connectors.nats.regression import LOOK_EVERY
from core.errors import (
    JETSTREAM_PUBLISH,
    NoStreamError,
    PermanentPublishError,
    PublishError,
    PublishFailed,
    PublishRefused,
    by_code,
)
from core.events import TRANSACTION_END
from core.message import Message

log = logging.getLogger("walflow.nats")

#: Messages in one batch at most: nats-server's default ``jetstream.limits.batch.max_msgs``
#: (a server set lower refuses larger batches: walflow stops and says so).
MAX_MSGS: Final = 1000
#: Bytes of messages in one batch at most: the server holds a batch whole until its commit,
#: and walflow holds the open unit and the batch in flight (the README's memory bound).
MAX_BYTES: Final = 8 * 1024 * 1024
#: What the batch headers may add to a message, beyond what :func:`payload_room` counts:
#: render leaves this much room (``Nats-Batch-Id`` 24, sequence, commit, the part headers).
BATCH_HEADERS: Final = 160
#: ``err_code`` s of a batch worth sending again (what it lacks): it holds an id the stream has
#: stored (10201: the batch is refused whole), it was abandoned (10176 incomplete, a gap).
_AGAIN: Final = frozenset({10201, 10176})
#: ``err_code`` of a batch larger than the server's ``jetstream.limits.batch.max_msgs``.
_TOO_MANY: Final = 10199
_HEADERS: Final = b"NATS/1.0\r\nNats-Msg-Id: %s\r\nNats-Batch-Id: %s\r\nNats-Batch-Sequence: %d\r\n%s%s\r\n"


class AtomicPublisher(AckPublisher):
    """Publishes one partition's units as atomic batches; :meth:`settle` returns once every
    whole unit handed to it is stored (the open one's messages wait for its end)."""

    batch_headers = BATCH_HEADERS

    def __init__(self, nc: WalflowClient, **options: Any) -> None:
        """``options``: :class:`~connectors.nats.publisher.AckPublisher`'s (its ``window`` goes
        unused: one batch is in flight)."""
        super().__init__(nc, **options)
        self._acks = self._on_ack  # only a batch's commit is answered: not the window's per-message acks
        #: Whole units not yet sent, and their size: sent as one batch.
        self._ready: list[Message] = []
        self._ready_bytes = 0
        #: The open unit: its messages not yet sent, their size, and its batches sent so far.
        self._unit: list[Message] = []
        self._unit_bytes = 0
        self._unit_batches = 0
        self._answer: asyncio.Future[tuple[bytes, bytes | None]] | None = None
        self._commit_reply = b""  # the reply subject of the latest batch's commit, which answers it

    async def publish(self, messages: list[Message]) -> None:
        """Add ``messages`` (units ended by :data:`TRANSACTION_END`) and send every whole unit."""
        if self._looked is None or self._looked[0] != self._nc.stats["reconnects"]:
            await self._look_again()
        for message in messages:
            if message is TRANSACTION_END:
                await self._unit_ended()
                continue
            size = len(message.payload) + len(message.headers)
            if self._unit and (len(self._unit) >= MAX_MSGS or self._unit_bytes + size > MAX_BYTES):
                await self._send_ready()  # what came before it goes first
                await self._send_part(last=False)  # more of it follows: not its last batch
            self._unit.append(message)
            self._unit_bytes += size
        await self._send_ready()

    async def settle(self) -> None:
        """Every whole unit is stored once :meth:`publish` returns: look at the stream now and then."""
        await self._send_ready()
        self._flush_metrics()
        if self._looked is None or time.monotonic() - self._looked[1] >= LOOK_EVERY:
            await self._look_again()

    async def _unit_ended(self) -> None:
        if self._unit_batches:  # split: its rest is its last batch, alone
            await self._send_ready()
            await self._send_part(last=True)
            return
        if self._ready and (len(self._ready) + len(self._unit) > MAX_MSGS
                            or self._ready_bytes + self._unit_bytes > MAX_BYTES):
            await self._send_ready()
        self._ready += self._unit
        self._ready_bytes += self._unit_bytes
        self._unit, self._unit_bytes = [], 0

    async def _send_ready(self) -> None:
        if self._ready:
            ready, self._ready, self._ready_bytes = self._ready, [], 0
            await self._commit(ready, b"")

    async def _send_part(self, last: bool) -> None:
        """The open unit's messages so far as its next batch (all of them when ``last``)."""
        self._unit_batches += 1
        k = self._unit_batches
        part = b"Walflow-Transaction-Batch: %d\r\n" % k
        if last:
            part += b"Walflow-Transaction-Batches: %d\r\n" % k
            batch, self._unit, self._unit_bytes, self._unit_batches = self._unit, [], 0, 0
        else:
            batch, self._unit, self._unit_bytes = self._unit, [], 0
        await self._commit(batch, part)

    async def _commit(self, batch: list[Message], part: bytes) -> None:
        """Store ``batch`` as one atomic batch, whatever it takes; ``part``: header lines for each message."""
        if self._skip:
            batch = [message for message in batch if message.msg_id not in self._skip]
        delay, floor = 0.1, self.last_seq
        while batch:
            error = await self._attempt(batch, part)
            if error is None:
                return
            if error.code == str(_TOO_MANY):
                raise PermanentPublishError(
                    f"{self._label}: the NATS server refuses an atomic batch of {len(batch)} messages: its "
                    f"jetstream.limits.batch.max_msgs is below walflow's {MAX_MSGS}. Raise it to {MAX_MSGS} (the "
                    "default), or set transactions: none")
            if not error.retryable:
                raise PermanentPublishError(f"JetStream refused an atomic batch of {len(batch)} message(s) on "
                                            f"{batch[0].subject.decode()}: {error}")
            log.warning("%s: an atomic batch of %d message(s) was not stored or not acknowledged (%s); asking the "
                        "stream what it holds, then sending again what it lacks", self._label, len(batch), error)
            self._metrics.publish_retries.labels(self._sink, "atomic_batch").inc()
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)
            while not self._nc.is_connected:
                if self._nc.is_closed:
                    raise PermanentPublishError(f"{self._label}: the NATS connection was closed for good (see the "
                                                f"errors above); {len(batch)} message(s) not stored")
                await asyncio.sleep(delay)
            if self._looked is None or self._looked[0] != self._nc.stats["reconnects"]:
                await self._look_again()
            if self._stored_since is not None:  # stored after all (its ack lost), or an id of it stored before
                stored = await self._stored_since(floor + 1)
                batch = [message for message in batch if message.msg_id not in stored]

    async def _attempt(self, batch: list[Message], part: bytes) -> PublishError | None:
        """Send ``batch`` once and wait for its commit's answer: None when it is stored."""
        nc = self._nc
        if not nc.is_connected:
            return PublishFailed("NATS is disconnected")
        batch_id = urlsafe_b64encode(os.urandom(18))
        reply = self._commit_reply = self._window.next_reply()
        last = len(batch) - 1
        commands = []
        for i, message in enumerate(batch):
            headers = _HEADERS % (message.msg_id.encode(), batch_id, i + 1,
                                  b"Nats-Batch-Commit: 1\r\n" if i == last else b"", part + message.headers)
            head = b"HPUB %s %s%d %d\r\n" % (message.subject, reply + b" " if i == last else b"", len(headers),
                                              len(headers) + len(message.payload))
            if len(headers) + len(message.payload) > nc.max_payload:
                return PublishRefused(f"a message with its batch headers is larger than the server's max_payload "
                                      f"({len(headers) + len(message.payload)} > {nc.max_payload} bytes)")
            commands.append(head + headers + message.payload + b"\r\n")
        answer = self._answer = asyncio.get_running_loop().create_future()
        self._sent_on = nc.stats["reconnects"]
        if not await nc.send_raw(b"".join(commands)):
            return PublishFailed("NATS is disconnected")
        deadline = time.monotonic() + self._ack_timeout
        while not answer.done():
            if (left := deadline - time.monotonic()) <= 0 or self._connection_lost():
                return PublishFailed(f"no acknowledgement within {self._ack_timeout:.0f}s" if left <= 0
                                     else "the connection it went out on was lost")
            try:
                await asyncio.wait_for(asyncio.shield(answer), min(left, 0.25))
            except TimeoutError:
                pass
        data, status = answer.result()
        return self._acked_batch(batch, data, status)

    def _acked_batch(self, batch: list[Message], data: bytes, status: bytes | None) -> PublishError | None:
        """What the commit's answer says: None when the batch is stored (counted as the publisher counts acks)."""
        if status and status.split(b"\r\n", 1)[0][len(b"NATS/1.0"):].strip().startswith(b"503"):
            return NoStreamError(batch[0].subject.decode())
        try:
            ack = json.loads(data)
        except ValueError:
            ack = None
        if not isinstance(ack, dict):
            return PublishFailed(f"unreadable acknowledgement {data[:100]!r}", "unreadable")
        error = ack.get("error")
        if error is not None or not isinstance(ack.get("seq"), int) or not ack["seq"]:
            if not isinstance(error, dict):
                return PublishFailed(f"unreadable acknowledgement {data[:100]!r}", "unreadable")
            code, err_code = error.get("code", 500), error.get("err_code")
            description = f"{error.get('description', 'error')} (code {code}, err_code {err_code})"
            if err_code in _AGAIN:
                return PublishFailed(description, str(err_code))
            if err_code == _TOO_MANY:
                return PublishRefused(description, str(err_code))
            kind: type[PublishError] = by_code(JETSTREAM_PUBLISH, code if isinstance(code, int) else 500, PublishRefused)
            return kind(description, str(code))
        now = time.time()
        for message in batch:
            self._window.count(message, now)
        self._acked_at(ack["seq"], batch[-1].msg_id)
        return None

    def _on_ack(self, subject: bytes, data: bytes, headers: bytes | None) -> None:
        """The answer to a batch's commit (only the commit carries a reply subject)."""
        answer = self._answer
        if answer is not None and not answer.done() and subject == self._commit_reply:
            answer.set_result((data, headers))
