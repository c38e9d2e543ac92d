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
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DeliverPolicy,
    DiscardPolicy,
    Header,
    RawStreamMsg,
    StorageType,
    StreamConfig,
)
from nats.js.errors import NotFoundError

from embedded.nats import NatsCluster, NatsServer

T = TypeVar("T")
#: Tries of a stream_info poll that timed out (30 s each) before a run gives up.
_API_ATTEMPTS = 3

#: Reply subject of a JetStream delivery: ``$JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.
#: <consumer seq>.<timestamp ns>.<pending>`` (v1), or v2 with domain and account hash in front
#: and a random token behind. nats-py turns the timestamp into a float datetime (µs at best);
#: latencies want it exact, so it is read from the subject.
_V1_TOKENS = 9
_ACK_PREFIX = "$JS.ACK."
#: :meth:`JetStream.read`: the consumer's idle heartbeat, and how long without any delivery or
#: heartbeat means the consumer is lost (then a new one resumes after the last message read).
_HEARTBEAT = 2.0
_STALLED = 10.0


@dataclass(frozen=True, slots=True)
class StoredMessage:
    """One message as JetStream stored it: what was published, its sequence and storage time."""

    seq: int
    time_ns: int
    subject: str
    data: bytes
    msg_id: str


class JetStream:
    """One NATS connection on a private event loop; every method blocks until done."""

    def __init__(self, server: NatsServer | NatsCluster) -> None:
        #: What a client connects with (the server's login in it), and what a walflow sink's
        #: destination says for the same server: the embedded NATS lets in nobody else.
        self.url = server.url
        self.destination = server.destination
        self._loop = asyncio.new_event_loop()
        self.nc = self.run(nats.connect(self.url, connect_timeout=5, max_reconnect_attempts=0))
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
        return self._state(stream)[0]

    def last_seq(self, stream: str) -> int:
        """The sequence of the last message ``stream`` stored; 0 while it does not exist."""
        return self._state(stream)[1]

    def _state(self, stream: str) -> tuple[int, int]:
        attempts = _API_ATTEMPTS
        while True:
            try:
                info = self.run(self.js.stream_info(stream))
            except NotFoundError:
                return 0, 0
            except nats.errors.TimeoutError:  # a cluster electing its leaders answers nothing for a while
                attempts -= 1
                if not attempts:
                    raise
                continue
            return int(info.state.messages), int(info.state.last_seq)

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

    def first_last(self, stream: str) -> tuple[RawStreamMsg, RawStreamMsg]:
        """The stream's first and last message, as stored (payload and storage time)."""
        info = self.run(self.js.stream_info(stream))
        first = self.run(self.js.get_msg(stream, info.state.first_seq))
        last = self.run(self.js.get_msg(stream, info.state.last_seq))
        return first, last

    def first_last_time(self, stream: str) -> tuple[datetime, datetime]:
        """Storage times of the stream's first and last message: JetStream stamps messages
        in sequence order, so these bound everything in between."""
        first, last = self.first_last(stream)
        assert first.time is not None and last.time is not None
        return first.time, last.time

    def read(self, stream: str, limit: int | None = None, timeout: float = 120.0) -> list[StoredMessage]:
        """The stream's messages in order (the first ``limit``).

        An ephemeral push consumer delivers to a plain subscription: nats-py's pull ``fetch``
        costs ~100 µs a message, which would make reading back a stream take longer than the
        benchmark. The server's flow control bounds what is in flight: it stops pushing once
        ~32 MB are unanswered and resumes when the flow-control request that follows them is
        answered, which the callback does after it has taken every message before it. An ack
        window counted in messages cannot do this: with 20,000 unacknowledged 2 KB messages the
        server logged "Slow Consumer Detected: MaxPending of 67108864 Exceeded" (64 MB queued
        for the connection) and closed it; what was queued was never delivered again. The
        subscription's own limits are off (0 is unlimited in nats-py), so the client drops
        nothing either.

        Should deliveries still go missing (a gap in the consumer sequence, a heartbeat naming
        a later delivery than the last one read, or ``_STALLED`` seconds of silence), a new
        consumer resumes after the last message read.
        """
        return self.run(self._read(stream, limit, timeout))

    async def _read(self, stream: str, limit: int | None, timeout: float) -> list[StoredMessage]:
        info = await self.js.stream_info(stream)
        want = int(info.state.messages) if limit is None else min(limit, int(info.state.messages))
        out: list[StoredMessage] = []
        deadline = asyncio.get_running_loop().time() + timeout
        while len(out) < want:
            await self._deliver(stream, out, want, deadline)
        return out

    async def _deliver(self, stream: str, out: list[StoredMessage], want: int, deadline: float) -> None:
        """Append what one consumer delivers to ``out``, starting after its last message;
        return when ``out`` holds ``want`` messages or the consumer lost some."""
        loop = asyncio.get_running_loop()
        finished: asyncio.Future[None] = loop.create_future()  # complete, or resume with a new consumer
        expect = 1  # the consumer sequence of the next delivery
        heard = 0  # deliveries and heartbeats, for the stall check

        def finish() -> None:
            if not finished.done():
                finished.set_result(None)

        async def collect(msg: Msg) -> None:
            nonlocal expect, heard
            heard += 1
            if finished.done():
                return
            reply = msg.reply
            if reply.startswith(_ACK_PREFIX):
                tokens = reply.split(".")
                if len(tokens) == _V1_TOKENS:
                    seq, dseq, stamp = tokens[5], tokens[6], tokens[7]
                else:
                    seq, dseq, stamp = tokens[7], tokens[8], tokens[9]
                if int(dseq) != expect:
                    finish()
                    return
                expect += 1
                msg_id = (msg.headers or {}).get("Nats-Msg-Id", "")
                out.append(StoredMessage(int(seq), int(stamp), msg.subject, msg.data, msg_id))
                if len(out) >= want:
                    finish()
            elif reply:
                # a flow-control request: every delivery before it has been taken (callbacks run in order)
                await self.nc.publish(reply)
            else:
                # an idle heartbeat: it names the last delivery, and a flow-control request whose answer was lost
                headers = msg.headers or {}
                stalled = headers.get(Header.CONSUMER_STALLED)
                if stalled:
                    await self.nc.publish(stalled)
                last = headers.get(Header.LAST_CONSUMER)
                if last is not None and int(last) >= expect:
                    finish()

        policy, start = (DeliverPolicy.BY_START_SEQUENCE, out[-1].seq + 1) if out else (DeliverPolicy.ALL, None)
        inbox = self.nc.new_inbox()
        sub = await self.nc.subscribe(inbox, cb=collect, pending_msgs_limit=0, pending_bytes_limit=0)
        consumer = None
        try:
            consumer = await self.js.add_consumer(
                stream,
                ConsumerConfig(
                    deliver_subject=inbox, deliver_policy=policy, opt_start_seq=start, ack_policy=AckPolicy.NONE,
                    flow_control=True, idle_heartbeat=_HEARTBEAT, mem_storage=True, num_replicas=1,
                    inactive_threshold=60.0,
                ),
            )
            while not finished.done():
                left = deadline - loop.time()
                if left <= 0:
                    raise TimeoutError(f"read {len(out):,} of {want:,} messages of stream {stream}")
                before = heard
                await asyncio.wait([finished], timeout=min(_STALLED, left))
                if heard == before and loop.time() < deadline:
                    finish()
        finally:
            await sub.unsubscribe()
            if consumer is not None:
                try:
                    await self.js.delete_consumer(stream, consumer.name)
                except NotFoundError:
                    pass
