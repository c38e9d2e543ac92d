"""Publishing to JetStream with many acknowledgements in flight, matched by walflow itself.

nats-py's ``publish_async`` costs ~25 µs a message, mostly building a ``PubAck`` per ack
(``shared/reference/nats-jetstream.md``). Here each message goes out as a core publish
whose reply subject is a token under one wildcard inbox; the ack JSON is read for
``seq``/``error`` only. nats-py still does connection, auth, TLS and reconnects.

Order and retries: messages go out in order on one connection, so JetStream stores them
in order. When any message fails (no ack within ``ack_timeout``, a disconnect, a retryable
JetStream error), :meth:`AckPublisher.settle` waits for the rest of the window and re-sends
the failed ones in their original order, with backoff, until JetStream takes them; their
``Nats-Msg-Id`` makes a message that was stored after all (its ack lost) a duplicate that
JetStream drops. A JetStream error that retrying cannot fix (4xx: a message too large, a
bad header) stops the flow with :class:`PermanentPublishError`.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import ConnectionClosedError, MaxPayloadError

from connectors.nats.messages import NatsMessage
from connectors.nats.stream import StreamSetupError

log = logging.getLogger("walflow.nats")

#: JetStream answers these 4xx codes for conditions that pass by themselves.
_TRANSIENT_4XX = {408, 409, 429}


class PublishError(Exception):
    """One message was not stored; ``retryable`` says whether sending it again can help."""

    def __init__(self, message: str, retryable: bool) -> None:
        super().__init__(message)
        self.retryable = retryable


class NoStreamError(PublishError):
    """No stream captures the subject (JetStream's 503 "no responders")."""

    def __init__(self, subject: str) -> None:
        super().__init__(f"no stream captures subject {subject}", True)


class PermanentPublishError(RuntimeError):
    """JetStream refused a message for a reason that retrying cannot fix."""


@dataclass(slots=True)
class _InFlight:
    message: NatsMessage
    token: str
    ack: asyncio.Future[int]
    #: When the message was first sent, and this partition's last acked sequence then:
    #: a message stored but unacknowledged has a higher sequence than that.
    first_sent: float
    floor_seq: int


class AckPublisher:
    """Publishes one partition's messages; :meth:`settle` returns once all of them are stored."""

    def __init__(
        self,
        nc: Client,
        *,
        window: int,
        ack_timeout: float,
        label: str,
        skip: frozenset[str] = frozenset(),
        on_no_stream: Callable[[], Awaitable[None]] | None = None,
        stored_since: Callable[[int], Awaitable[set[str]]] | None = None,
        duplicate_window: float = 120.0,
    ) -> None:
        self._nc = nc
        self._on_no_stream = on_no_stream  # the stream vanished (deleted while running): set it up again
        # Re-sending a message first sent longer ago than the duplicate window: JetStream
        # would store it twice if its ack was lost, so ask the stream what it holds first.
        self._stored_since = stored_since
        self._duplicate_window = duplicate_window
        self._skip = skip  # ids found already in the stream at startup (connectors/nats/replay.py)
        self._window = window
        self._ack_timeout = ack_timeout
        self._label = label
        self._inbox = nc.new_inbox()
        self._tokens = itertools.count()
        self._waiting: dict[str, _InFlight] = {}
        self._inflight: deque[_InFlight] = deque()
        self._sub: Subscription | None = None
        self._generation = nc.stats["reconnects"]  # the connection the window's messages went out on
        self.last_seq = 0  # the highest stream sequence acknowledged to this partition

    async def start(self) -> None:
        self._sub = await self._nc.subscribe(f"{self._inbox}.*", cb=self._on_ack)

    async def close(self) -> None:
        if self._sub is not None:
            await self._sub.unsubscribe()

    async def publish(self, messages: list[NatsMessage]) -> None:
        """Send ``messages`` in order, keeping at most ``window`` unacknowledged.

        Nothing newer goes out while something older may need a re-send: after a failed send,
        and whenever the connection is down or was re-established since the window's messages
        went out, the window is settled first — or a row's later change could be stored ahead
        of an earlier one that is re-sent.
        """
        for message in messages:
            if message.msg_id in self._skip:
                continue
            if self._inflight and (not self._nc.is_connected or self._nc.stats["reconnects"] != self._generation):
                await self.settle()
            while len(self._inflight) >= self._window:
                head = self._inflight[0]
                try:
                    await asyncio.wait_for(asyncio.shield(head.ack), self._ack_timeout)
                except (TimeoutError, PublishError):
                    await self.settle()  # deal with the failure before anything newer goes out
                    continue
                self.last_seq = max(self.last_seq, self._inflight.popleft().ack.result())
            entry = await self._send(message, time.monotonic(), self.last_seq)
            self._inflight.append(entry)
            if entry.ack.done():  # the send itself failed (disconnected): settle before the next one
                await self.settle()

    async def settle(self) -> None:
        """Wait until every message sent so far is stored, re-sending failures in order."""
        delay = 0.1
        while self._inflight:
            self._generation = self._nc.stats["reconnects"]
            batch = list(self._inflight)
            self._inflight.clear()
            done, _ = await asyncio.wait([f.ack for f in batch], timeout=self._ack_timeout)
            failed: list[_InFlight] = []
            no_stream = False
            for entry in batch:
                if entry.ack not in done:
                    self._waiting.pop(entry.token, None)
                    entry.ack.cancel()
                    failed.append(entry)
                    reason = f"no acknowledgement within {self._ack_timeout:.0f}s"
                    continue
                error = entry.ack.exception()
                if error is None:
                    self.last_seq = max(self.last_seq, entry.ack.result())
                    continue
                if isinstance(error, PublishError) and not error.retryable:
                    raise PermanentPublishError(
                        f"JetStream refused {entry.message.subject} (Nats-Msg-Id {entry.message.msg_id}): {error}"
                    )
                failed.append(entry)
                reason = str(error)
                no_stream = no_stream or isinstance(error, NoStreamError)
            if not failed:
                return
            log.warning("%s: %d message(s) not stored (%s); re-sending in order", self._label, len(failed), reason)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)
            while not self._nc.is_connected:  # re-send on a live connection, in order
                await asyncio.sleep(delay)
            if no_stream and self._on_no_stream is not None:
                try:
                    await self._on_no_stream()
                except StreamSetupError:
                    raise
                except Exception as exc:  # noqa: BLE001 - NATS went away again: the next round retries
                    log.warning("%s: could not check the stream (%s); retrying", self._label, exc)
            failed = await self._drop_stored(failed)
            self._generation = self._nc.stats["reconnects"]
            for old in failed:
                self._inflight.append(await self._send(old.message, old.first_sent, old.floor_seq))

    async def _drop_stored(self, failed: list[_InFlight]) -> list[_InFlight]:
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

    async def _send(self, message: NatsMessage, first_sent: float, floor_seq: int) -> _InFlight:
        token = str(next(self._tokens))
        ack: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        entry = _InFlight(message, token, ack, first_sent, floor_seq)
        self._waiting[token] = entry
        try:
            await self._nc.publish(
                message.subject, message.payload, reply=f"{self._inbox}.{token}", headers={"Nats-Msg-Id": message.msg_id}
            )
        except MaxPayloadError:
            self._waiting.pop(token, None)
            ack.set_exception(
                PublishError(f"the message is larger than the server's max_payload ({len(message.payload)} bytes)", False)
            )
        except ConnectionClosedError:
            self._waiting.pop(token, None)
            ack.set_exception(PublishError("the NATS connection was closed for good (see the errors above)", False))
        except Exception as exc:  # noqa: BLE001 - disconnected, draining, ...: re-sent by settle()
            self._waiting.pop(token, None)
            ack.set_exception(PublishError(f"{type(exc).__name__}: {exc}", True))
        return entry

    async def _on_ack(self, msg: Msg) -> None:
        entry = self._waiting.pop(msg.subject.rsplit(".", 1)[1], None)
        if entry is None or entry.ack.done():
            return  # an ack for a message already given up on (and re-sent)
        ack = entry.ack
        status = msg.headers.get("Status") if msg.headers else None
        if status == "503":
            ack.set_exception(NoStreamError(entry.message.subject))
            return
        try:
            reply = json.loads(msg.data)
        except ValueError:
            ack.set_exception(PublishError(f"unreadable acknowledgement {msg.data[:100]!r}", True))
            return
        error = reply.get("error")
        if error:
            code = int(error.get("code", 500))
            retryable = code >= 500 or code in _TRANSIENT_4XX
            text = f"{error.get('description', 'error')} (code {code}, err_code {error.get('err_code')})"
            ack.set_exception(PublishError(text, retryable))
        else:
            ack.set_result(int(reply["seq"]))
