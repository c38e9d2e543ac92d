"""A synchronous handle on JetStream for the benchmark's own bookkeeping.

The benchmark is a sequence of blocking steps (start a process, poll, stop it); nats-py is
asyncio. One private event loop and one connection serve every step, instead of a new
connection per poll: polling every 50 ms must not itself be a load worth measuring.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

import nats
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, DiscardPolicy, StorageType, StreamConfig
from nats.js.errors import NotFoundError

T = TypeVar("T")

#: Reply subject of a JetStream delivery: ``$JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.
#: <consumer seq>.<timestamp ns>.<pending>`` (v1), or v2 with domain and account hash in front
#: and a random token behind. nats-py turns the timestamp into a float datetime (µs at best);
#: latencies want it exact, so it is read from the subject.
_V1_TOKENS = 9
#: Flow control of :meth:`JetStream.read`: unacknowledged messages at most, and how often to ack.
_IN_FLIGHT = 20_000
_ACK_EVERY = 1_000


@dataclass(frozen=True, slots=True)
class StoredMessage:
    """One message as JetStream stored it: what was published, its sequence and storage time."""

    seq: int
    time_ns: int
    subject: str
    data: bytes
    msg_id: str


def _stored(msg: Msg) -> StoredMessage:
    tokens = msg.reply.split(".")
    seq, stamp = (tokens[5], tokens[7]) if len(tokens) == _V1_TOKENS else (tokens[7], tokens[9])
    msg_id = (msg.headers or {}).get("Nats-Msg-Id", "")
    return StoredMessage(int(seq), int(stamp), msg.subject, msg.data, msg_id)


class JetStream:
    """One NATS connection on a private event loop; every method blocks until done."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._loop = asyncio.new_event_loop()
        self.nc = self.run(nats.connect(url, connect_timeout=5, max_reconnect_attempts=0))
        # API calls wait up to 30 s, not nats-py's 5: on a saturated 2-core machine a stream_info
        # poll must not end a run that is merely slow
        self.js = self.nc.jetstream(timeout=30)

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run a coroutine on this handle's loop (where ``nc`` lives)."""
        return self._loop.run_until_complete(coro)

    def close(self) -> None:
        self.run(self.nc.close())
        self._loop.close()

    @property
    def server_version(self) -> str:
        v = self.nc.connected_server_version
        return f"{v.major}.{v.minor}.{v.patch}"

    def count(self, stream: str) -> int:
        """Messages in ``stream``; 0 while it does not exist (walflow creates it at startup)."""
        try:
            info = self.run(self.js.stream_info(stream))
        except NotFoundError:
            return 0
        return int(info.state.messages)

    def last_seq(self, stream: str) -> int:
        """The sequence of the last message ``stream`` stored; 0 while it does not exist."""
        try:
            info = self.run(self.js.stream_info(stream))
        except NotFoundError:
            return 0
        return int(info.state.last_seq)

    def add_stream(self, name: str, subjects: list[str]) -> None:
        """A stream as walflow creates one by default (file storage, 2 min duplicate window)."""
        self.run(
            self.js.add_stream(
                StreamConfig(
                    name=name,
                    subjects=subjects,
                    storage=StorageType.FILE,
                    duplicate_window=120.0,
                    discard=DiscardPolicy.OLD,
                )
            )
        )

    def delete_stream(self, name: str) -> None:
        try:
            self.run(self.js.delete_stream(name))
        except NotFoundError:
            pass

    def first_last_time(self, stream: str) -> tuple[datetime, datetime]:
        """Storage times of the stream's first and last message: JetStream stamps messages
        in sequence order, so these bound everything in between."""
        info = self.run(self.js.stream_info(stream))
        first = self.run(self.js.get_msg(stream, info.state.first_seq))
        last = self.run(self.js.get_msg(stream, info.state.last_seq))
        assert first.time is not None and last.time is not None
        return first.time, last.time

    def read(self, stream: str, limit: int | None = None, timeout: float = 120.0) -> list[StoredMessage]:
        """The stream's messages in order (the first ``limit``).

        One ephemeral push consumer delivers to a plain subscription: nats-py's pull ``fetch``
        costs ~100 µs a message, which would make reading back a stream take longer than the
        benchmark. Acknowledging every ``_ACK_EVERY``-th message (ack policy "all") with at most
        ``_IN_FLIGHT`` unacknowledged is the flow control: without it the server pushes faster
        than Python reads and drops the connection as a slow consumer.
        """
        return self.run(self._read(stream, limit, timeout))

    async def _read(self, stream: str, limit: int | None, timeout: float) -> list[StoredMessage]:
        info = await self.js.stream_info(stream)
        want = int(info.state.messages) if limit is None else min(limit, int(info.state.messages))
        out: list[StoredMessage] = []
        if want == 0:
            return out
        done = asyncio.get_running_loop().create_future()

        async def collect(msg: Msg) -> None:
            if len(out) >= want:
                return
            out.append(_stored(msg))
            if len(out) % _ACK_EVERY == 0:
                await msg.ack()
            if len(out) == want and not done.done():
                done.set_result(None)

        inbox = self.nc.new_inbox()
        sub = await self.nc.subscribe(inbox, cb=collect, pending_msgs_limit=0, pending_bytes_limit=0)
        consumer = await self.js.add_consumer(
            stream,
            ConsumerConfig(
                deliver_subject=inbox, deliver_policy=DeliverPolicy.ALL, ack_policy=AckPolicy.ALL,
                max_ack_pending=_IN_FLIGHT, ack_wait=timeout, inactive_threshold=60.0,
            ),
        )
        try:
            await asyncio.wait_for(done, timeout)
        finally:
            await sub.unsubscribe()
            await self.js.delete_consumer(stream, consumer.name)
        return out
