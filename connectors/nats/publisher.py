"""Publishing to JetStream with many acknowledgements in flight, matched by walflow itself.

A batch of messages is written as one block of ``HPUB`` commands through nats-py's own
outgoing queue (so nothing overtakes a command nats-py queued first), each with a reply
subject that is a token under one wildcard inbox; acks arrive there and are read straight
from the wire (:class:`connectors.nats.natspy.WalflowClient`): ``seq`` from the JSON, an
error only when there is one. nats-py's ``publish_async`` would build a future and a
``PubAck`` per message (the README's *Performance*). nats-py still does connection, auth,
TLS and reconnects.

A message arrives addressed (:class:`core.message.Message`: subject, payload, id, headers);
nothing here computes a subject. Messages go out in order on one connection, so JetStream
stores them in order. When any fails (no ack within ``ack_timeout``, a disconnect, a
:class:`core.errors.PublishFailed`), :meth:`AckPublisher.settle` waits for the rest of the
window and re-sends the failed ones in their original order, with backoff; their
``Nats-Msg-Id`` makes one stored after all a duplicate JetStream drops. Two messages of one
row (:attr:`core.message.Message.row`) are never in flight at once: the later is held back and
sent once the earlier is stored, so a leader change cannot drop one and store the next
(``docs/design.md``, *the row fence*). A
:class:`core.errors.PublishRefused` stops the flow (:class:`core.errors.PermanentPublishError`);
which ack codes are which is :data:`core.errors.JETSTREAM_PUBLISH`'s to say. A message over
the server's ``max_payload`` is refused before it is sent: the invariant behind render's size
policy (``core/sizes.py``), not a policy of its own.

Metrics (:mod:`core.metrics`): acks counted by the message's labels (why those:
``docs/design.md``, *connectors/nats/publisher.py*), commit → ack latency
observed, in plain ints added to the process's metrics once per share of the window and at
every :meth:`AckPublisher.settle`; retries and error acks as they are handled.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable

from connectors.nats.frames import DirectHandler
from connectors.nats.natspy import WalflowClient
from connectors.nats.regression import LOOK_EVERY, Acked, AckTimes, Regression
from connectors.nats.window import HEADERS_SIZE, InFlight, Window
from core.errors import (
    JETSTREAM_PUBLISH,
    FatalError,
    NoStreamError,
    PermanentPublishError,
    PublishError,
    PublishFailed,
    PublishRefused,
    StreamRegressed,
    StreamSetupError,
    by_code,
)
from core.message import Message
from core.metrics import CounterBatch, Metrics

log = logging.getLogger("walflow.nats")

#: Once the window is full, wait until this share of it is acknowledged before sending
#: more: a wake-up per ack would send one message per socket write.
_REFILL = 4
#: Seconds between two looks at the connection while an ack is awaited: acks of messages sent
#: on a connection that was lost never come, and need not be waited out to ``ack_timeout``.
_LOST_CHECK = 0.25
#: Seconds between two warnings that the stream does not answer the look.
_LOOK_WARN_EVERY = 30.0


def payload_room(max_payload: int) -> int:
    """What a message's payload, ``Nats-Msg-Id`` and own header lines may take together on a
    server with ``max_payload``, as :meth:`connectors.nats.window.Window.commands` counts them: where render
    re-renders a message too large (``transforms/render.py``) before it gets here."""
    return max_payload - HEADERS_SIZE


class AckPublisher:
    """Publishes one partition's messages; :meth:`settle` returns once all of them are stored."""

    #: What the publisher adds to a message's headers beyond :func:`payload_room`'s count (an
    #: atomic batch's headers): render leaves the room.
    batch_headers = 0

    def __init__(
        self,
        nc: WalflowClient,
        *,
        window: int,
        ack_timeout: float,
        label: str,
        skip: frozenset[str] = frozenset(),
        on_no_stream: Callable[[], Awaitable[None]] | None = None,
        stored_since: Callable[[int], Awaitable[set[str]]] | None = None,
        duplicate_window: float = 120.0,
        look: Callable[[Acked, AckTimes], Awaitable[tuple[Regression | None, str | None]]] | None = None,
        sink: str = "",
        metrics: Metrics | None = None,
    ) -> None:
        """``look``: whether the stream still holds what it acknowledged (``regression.py``;
        None: never looked at); ``sink``: the sink's name, as metrics label it; ``metrics``:
        the process's (else its own)."""
        self._nc = nc
        self._on_no_stream = on_no_stream  # the stream vanished (deleted while running): set it up again
        # Re-sending a message first sent longer ago than the duplicate window: JetStream
        # would store it twice if its ack was lost, so ask the stream what it holds first.
        self._stored_since = stored_since
        self._duplicate_window = duplicate_window
        self._skip = skip  # ids found already in the stream at startup (connectors/nats/replay.py)
        self._size = window
        self._ack_timeout = ack_timeout
        self._label = label
        self._inbox = nc.new_inbox()
        #: A release of held messages is scheduled (an ack freed a row of theirs), and the task.
        self._release: asyncio.Task[None] | None = None
        self._settling = False  # settle re-sends failures ahead of held messages: no release meanwhile
        self._sid: int | None = None
        self._wake: tuple[InFlight, asyncio.Future[None]] | None = None  # who waits for which ack
        self._failed = False  # JetStream refused a message in the window: settle before sending more
        self._generation = nc.stats["reconnects"]  # the connection the window's messages went out on
        self._sent_on = self._generation  # the connection the latest messages were written to
        self.last_seq = 0  # the highest stream sequence acknowledged to this partition
        self.last_id = ""  # the id of the message stored there
        self._look = look
        self._ack_times = AckTimes()
        self._created: str | None = None  # when the stream was created, as the last look found
        self._look_warned = -_LOOK_WARN_EVERY  # when the last "cannot look" warning was logged
        self._looked: tuple[int, float] | None = None  # the connection and the time of the last look
        metrics = metrics or Metrics()
        self._sink = sink
        self._metrics = metrics
        self._published: CounterBatch[tuple[str, str]] = CounterBatch(
            metrics.changes_published, lambda labels: (sink, *labels))
        self._latency = metrics.commit_to_ack.batch(sink)
        #: The messages in flight and held back, and the count of those stored (nothing of it
        #: waits on I/O: compiled with the hot path).
        self._window = Window(f"{self._inbox}.".encode(), self._published.counts, self._latency, self._noticed)
        #: What the acks on the inbox are handed to, straight from the wire.
        self._acks: DirectHandler = self._window.on_ack
        self._window_wait = metrics.backpressure.labels("sink_window")
        metrics.track_window(sink, lambda: len(self._window.inflight), window)

    async def start(self) -> None:
        self._sid = await self._nc.subscribe_direct(f"{self._inbox}.*", self._acks)

    async def close(self) -> None:
        if self._sid is not None:
            await self._nc.unsubscribe_direct(self._sid)

    async def publish(self, messages: list[Message]) -> None:
        """Send ``messages`` in order, keeping at most ``window`` unacknowledged.

        Nothing newer goes out while something older may need a re-send: after a failed send,
        and whenever the connection is down or was re-established since the window's messages
        went out, the window is settled first — or a row's later change could be stored ahead
        of an earlier one that is re-sent.
        """
        if self._skip:
            messages = [message for message in messages if message.msg_id not in self._skip]
        now, sent = time.monotonic(), 0
        if self._looked is None or self._looked[0] != self._nc.stats["reconnects"]:
            await self._look_again()  # a stream a new connection finds may have gone back
        window = self._window
        while sent < len(messages):
            if window.held:
                await self._send_held()
            if window.inflight and (
                self._failed or not self._nc.is_connected or self._nc.stats["reconnects"] != self._generation
            ):
                await self.settle()
            room = self._size - len(window.inflight) - len(window.held)
            if room <= 0:
                waiting_since = time.monotonic()
                await self._make_room()
                self._window_wait.inc(time.monotonic() - waiting_since)
                continue
            floor = self.last_seq
            chunk = [InFlight(message, now, floor) for message in messages[sent : sent + room]]
            sent += len(chunk)
            if not await self._send(chunk):  # not all of it went out: settle before anything newer
                await self.settle()

    async def settle(self) -> None:
        """Wait until every message sent so far is stored, re-sending failures in order; and
        every :data:`~connectors.nats.regression.LOOK_EVERY` seconds, look whether the stream
        still holds what it acknowledged."""
        try:
            await self._settle()
        finally:
            self._flush_metrics()
        if self._looked is None or time.monotonic() - self._looked[1] >= LOOK_EVERY:
            await self._look_again()

    async def _look_again(self) -> None:
        """Raise :class:`~core.errors.StreamRegressed` if the stream lost a message it acknowledged
        to this partition. Until the stream answers (it has no leader yet, NATS went away again)
        nothing is sent: a row's newer changes must not be stored before what it lost."""
        generation = self._nc.stats["reconnects"]
        if self._look is None:
            self._looked = (generation, time.monotonic())
            return
        delay = 0.1
        while True:
            try:
                found, created = await self._look(Acked(self.last_seq, self.last_id, self._created), self._ack_times)
                break
            except FatalError:
                raise  # e.g. the user may not read the stream (the target says what to grant)
            except Exception as exc:  # noqa: BLE001 - no answer yet (no leader, NATS away again): look again
                if delay >= 5.0 and time.monotonic() - self._look_warned >= _LOOK_WARN_EVERY:
                    self._look_warned = time.monotonic()
                    log.warning("%s: cannot look whether the stream still holds what it acknowledged (%s); sending "
                                "nothing until it answers", self._label, exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
        self._looked = (generation, time.monotonic())
        if self._created is not None and created != self._created:
            log.warning("%s: the stream was deleted and created again; what the old one held is gone with it",
                        self._label)
            self.last_seq, self.last_id, self._ack_times = 0, "", AckTimes()
        self._created = created
        if found is not None:
            raise StreamRegressed(found.line(), found.as_json())

    def _flush_metrics(self) -> None:
        """Add the acknowledgements counted since the last flush to the process's metrics."""
        self._published.flush()
        self._latency.flush()

    async def _settle(self) -> None:
        self._settling = True
        try:
            await self._settle_rounds()
        finally:
            self._settling = False

    async def _settle_rounds(self) -> None:
        delay = 0.1
        window = self._window
        while window.inflight or window.held:
            if window.held:
                await self._send_held()  # what did not go out is in the window as failed: this round sees it
            self._generation = self._nc.stats["reconnects"]
            batch = list(window.inflight)
            window.inflight.clear()
            deadline = time.monotonic() + self._ack_timeout
            for entry in batch:
                if not entry.done and not await self._until_done(entry, deadline - time.monotonic()):
                    break  # the rest waited as long: whatever is not acked now has failed
            lost = self._connection_lost()
            failed: list[InFlight] = []
            no_stream = False
            reason = ""
            retries: defaultdict[str, int] = defaultdict(int)  # by metrics' reason
            stored = None  # the acknowledged entry with the highest sequence
            for entry in batch:
                error = entry.error
                if entry.seq:
                    if stored is None or entry.seq > stored.seq:
                        stored = entry
                    continue
                if error is not None and error.code is not None:
                    self._metrics.publish_failures.labels(self._sink, error.code).inc()
                if error is None and lost:
                    reason = "the connection they went out on was lost before their acknowledgement"
                    retries["disconnected"] += 1
                elif error is None:
                    reason = f"no acknowledgement within {self._ack_timeout:.0f}s"
                    retries["ack_timeout"] += 1
                elif not error.retryable:
                    raise PermanentPublishError(
                        f"JetStream refused {entry.published_on} (Nats-Msg-Id {entry.message.msg_id}): {error}"
                    )
                else:
                    reason = str(error)
                    no_stream = no_stream or isinstance(error, NoStreamError)
                    retries["disconnected" if error.code is None else "jetstream_error"] += 1
                failed.append(entry)
            if stored is not None:
                self._stored(stored)
            window.waiting.clear()  # a late ack of a failed message changes nothing: it is re-sent
            window.rows.clear()
            self._failed = False
            for why, n in retries.items():
                self._metrics.publish_retries.labels(self._sink, why).inc(n)
            if not failed:
                continue  # held messages, if any, go out now that their rows' are stored
            log.warning("%s: %d message(s) not stored (%s); re-sending in order", self._label, len(failed), reason)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)
            while not self._nc.is_connected:  # re-send on a live connection, in order
                if self._nc.is_closed:  # nats-py gave up on it (e.g. the server refused a command)
                    raise PermanentPublishError(
                        f"{self._label}: the NATS connection was closed for good (see the errors above); "
                        f"{len(failed)} message(s) not stored"
                    )
                await asyncio.sleep(delay)
            if no_stream and self._on_no_stream is not None:
                try:
                    await self._on_no_stream()
                except StreamSetupError:
                    raise
                except Exception as exc:  # noqa: BLE001 - NATS went away again: the next round retries
                    log.warning("%s: could not check the stream (%s); retrying", self._label, exc)
            if self._looked is None or self._looked[0] != self._nc.stats["reconnects"]:
                await self._look_again()  # before a re-send: the stream may have gone back meanwhile
            failed = await self._drop_stored(failed)
            self._generation = self._nc.stats["reconnects"]
            # ahead of the held ones: they are older than any held message of their row
            window.held[:0] = [old.again() for old in failed]
            await self._send_held()

    async def _make_room(self) -> None:
        """Wait until a share of the full window is acknowledged; settle if a message failed."""
        inflight = self._window.inflight
        if not inflight:
            return  # only held messages: the caller sends them
        target = inflight[min(len(inflight) - 1, self._size // _REFILL)]
        if not target.done and not await self._until_done(target, self._ack_timeout):
            await self.settle()
            return
        last = None
        while inflight and inflight[0].seq:
            last = inflight.popleft()
        if last is not None:
            self._stored(last)
        self._flush_metrics()
        if inflight and (inflight[0].error is not None or len(inflight) >= self._size):  # deal with a failure first
            await self.settle()

    def _stored(self, entry: InFlight) -> None:
        """``entry`` was acknowledged (acks come in the order of their sequences here)."""
        self._acked_at(entry.seq, entry.message.msg_id)

    def _acked_at(self, seq: int, msg_id: str) -> None:
        """JetStream stored ``msg_id`` at ``seq``: what the regression look checks it still holds."""
        if seq > self.last_seq:
            self.last_seq, self.last_id = seq, msg_id
            self._ack_times.acked(seq, msg_id, time.monotonic())

    def _connection_lost(self) -> bool:
        """The connection the latest messages went out on is gone: their acks will not come."""
        return not self._nc.is_connected or self._nc.stats["reconnects"] != self._sent_on

    async def _until_done(self, entry: InFlight, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for ``entry``'s ack (or error); False if none came,
        or once the connection it went out on is lost (a restarted server forgot it)."""
        if entry.done:
            return True
        wake: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._wake = (entry, wake)
        self._window.awaited = entry
        deadline = time.monotonic() + timeout
        try:
            while (left := deadline - time.monotonic()) > 0 and not self._connection_lost():
                try:
                    await asyncio.wait_for(asyncio.shield(wake), min(left, _LOST_CHECK))
                    return True
                except TimeoutError:
                    if entry.done:
                        return True
            return entry.done
        finally:
            self._wake = None
            self._window.awaited = None

    async def _release_held(self) -> None:
        """Send the held messages an ack freed, between batches (a write or a snapshot may be a
        second away); a failure is the next :meth:`publish` or :meth:`settle`'s to handle."""
        try:
            if self._window.held and not self._settling:
                await self._send_held()
        finally:
            self._release = None

    async def _send_held(self) -> bool:
        """Send the held messages whose row has none in flight any more (the others stay held,
        in order). False: not all that went out were written (settle)."""
        window = self._window
        held, window.held = window.held, []
        window.held_rows.clear()
        return await self._send(held)

    async def _send(self, entries: list[InFlight]) -> bool:
        """Put ``entries`` in the window and write them to the socket as one block of commands;
        one whose row has a message in flight is held back instead (two of a row are never in
        flight at once, so JetStream cannot drop the earlier — a leader change — and store the
        later), and so is every later one of that row.

        Returns False if not all of those put in the window went out (their ``error`` says why;
        nothing after a message that cannot be sent at all is sent): :meth:`settle` must run
        before anything newer, and re-sends the retryable ones in order."""
        nc = self._nc
        if not nc.is_connected:
            self._window.inflight.extend(entries)
            closed = nc.is_closed
            for entry in entries:
                entry.error = (PublishRefused("the NATS connection was closed for good (see the errors above)") if closed
                               else PublishFailed("NATS is disconnected"))
            return not entries
        self._sent_on = nc.stats["reconnects"]
        block, sent, taken = self._window.commands(entries, nc.max_payload)
        if sent and not await nc.send_raw(block):  # the connection dropped meanwhile
            for entry in entries[:sent]:
                entry.error = PublishFailed("NATS is disconnected")
            return False
        return sent == taken

    async def _drop_stored(self, failed: list[InFlight]) -> list[InFlight]:
        """Leave out failed messages that JetStream stored after all, when its duplicate
        window may no longer recognise them."""
        stale = time.monotonic() - 0.8 * self._duplicate_window
        if self._stored_since is None or not any(entry.first_sent < stale for entry in failed):
            return failed
        stored = await self._stored_since(min(entry.floor_seq for entry in failed) + 1)
        kept = [entry for entry in failed if entry.message.msg_id not in stored]
        if len(kept) < len(failed):
            log.info("%s: %d message(s) were stored after all; not sending them again",
                     self._label, len(failed) - len(kept))
        return kept

    def _noticed(self, entry: InFlight, stored: bool, unfenced: int, data: bytes, headers: bytes | None) -> None:
        """An ack the window told of (:meth:`~connectors.nats.window.Window.on_ack`): the others
        are stored, counted and no one waits for them."""
        if stored:
            if unfenced and unfenced in self._window.held_rows and self._release is None and not self._settling:
                self._release = asyncio.get_running_loop().create_task(self._release_held())
        else:
            entry.error = _ack_error(entry.published_on, data, headers)
            self._failed = True
        wake = self._wake
        if wake is not None and wake[0] is entry and not wake[1].done():
            wake[1].set_result(None)


def _ack_error(subject: str, data: bytes, headers: bytes | None) -> PublishError:
    """What an ack without a sequence says went wrong: its class by JetStream's code
    (:data:`core.errors.JETSTREAM_PUBLISH`)."""
    status = headers.split(b"\r\n", 1)[0][len(b"NATS/1.0"):].strip() if headers else b""
    if status.startswith(b"503"):
        return NoStreamError(subject)
    try:
        error = json.loads(data).get("error")
        code = int(error.get("code", 500))
    except (ValueError, AttributeError, TypeError):
        return PublishFailed(f"unreadable acknowledgement {status.decode(errors='replace')} {data[:100]!r}",
                             "unreadable")
    kind: type[PublishError] = by_code(JETSTREAM_PUBLISH, code, PublishRefused)
    return kind(f"{error.get('description', 'error')} (code {code}, err_code {error.get('err_code')})", str(code))
