"""The publisher's row fence: two messages of one row are never in flight at once.

During a leader change JetStream may answer one message with 503 and store the next one sent
right after it (``tests/dataflows/test_nats_cluster.py`` saw it); the re-send of the first
then lands behind the second. No real server drops one and stores the next on demand, so this
drives :class:`~connectors.nats.publisher.AckPublisher` over a connection that answers as a
script says and records the order messages were written in.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable

from connectors.nats.publisher import AckPublisher
from connectors.nats.sink import JetStreamPartition
from core.events import BARRIER
from core.message import Message
from core.runtime import Runtime

_HPUB = re.compile(rb"HPUB (\S+) (\S+) \d+ \d+\r\nNATS/1.0\r\nNats-Msg-Id: (\S+)\r\n")


class _Scripted:
    """A connection whose server stores every message but answers the first sending of the ids
    in ``refused`` with a 503, as JetStream without a leader does."""

    def __init__(self, refused: set[str]) -> None:
        self.stats = {"reconnects": 0}
        self.is_connected, self.is_closed, self.max_payload = True, False, 1 << 20
        self.refused = refused
        self.written: list[str] = []  # ids in the order they were written
        self.stored: list[str] = []
        self.on_ack: Callable[[bytes, bytes, bytes | None], None] | None = None

    def new_inbox(self) -> str:
        return "_INBOX.t"

    async def subscribe_direct(self, subject: str, callback: Callable[[bytes, bytes, bytes | None], None]) -> int:
        self.on_ack = callback
        return 1

    async def unsubscribe_direct(self, sid: int) -> None:
        pass

    async def send_raw(self, data: bytes) -> bool:
        loop = asyncio.get_running_loop()
        for _, reply, msg_id in _HPUB.findall(data):
            name = msg_id.decode()
            self.written.append(name)
            assert self.on_ack is not None
            if name in self.refused:
                self.refused.discard(name)
                loop.call_soon(self.on_ack, reply, b"", b"NATS/1.0 503\r\n\r\n")
            else:
                self.stored.append(name)
                loop.call_soon(self.on_ack, reply, b'{"stream":"S","seq":%d}' % len(self.stored), None)
        return True


def _message(msg_id: str, row: int) -> Message:
    message = Message(b"wf.app.public.t.update", b"{}", msg_id, ("public.t", "update"))
    message.row = row
    return message


def _publish(refused: set[str], messages: list[Message]) -> _Scripted:
    nc = _Scripted(refused)

    async def run() -> None:
        publisher = AckPublisher(nc, window=1024, ack_timeout=5, label="t-0")  # type: ignore[arg-type]
        await publisher.start()
        await publisher.publish(messages)
        await publisher.settle()

    asyncio.run(run())
    return nc


def test_a_rows_next_change_waits_until_its_earlier_one_is_stored() -> None:
    # a1 and a2 change row 1, b1 row 2: a1 is refused once (no leader yet), b1 is stored at once
    nc = _publish({"a1"}, [_message("a1", 1), _message("b1", 2), _message("a2", 1)])
    assert nc.written[:2] == ["a1", "b1"]  # other rows go on in the same window
    assert nc.stored.index("a1") < nc.stored.index("a2")  # the row's order holds
    assert sorted(nc.stored) == ["a1", "a2", "b1"]  # each once


def test_without_rows_the_window_is_pipelined_whole() -> None:
    nc = _publish(set(), [_message(f"m{i}", 0) for i in range(5)])
    assert nc.written == nc.stored == [f"m{i}" for i in range(5)]


def test_a_row_changed_many_times_in_a_row_keeps_its_order_through_refusals() -> None:
    messages = [_message(f"r{i}", 7) for i in range(6)]
    nc = _publish({"r0", "r3"}, messages)
    assert nc.stored == [f"r{i}" for i in range(6)]


def test_a_barrier_is_stored_after_everything_before_it_and_before_everything_after() -> None:
    # the marker (a BARRIER) is refused once: the message after it, of another row, must wait
    # for its re-send, and the one before it must be stored first
    nc = _Scripted({"end"})
    runtime = Runtime()
    publisher = AckPublisher(nc, window=1024, ack_timeout=5, label="t-0")  # type: ignore[arg-type]
    runtime.run(publisher.start())
    partition = JetStreamPartition(publisher, nc, "t-0", runtime, None, barriers=True)  # type: ignore[arg-type]
    partition.write_batch([_message("a1", 1), _message("end", BARRIER), _message("b1", 2)])
    partition.snapshot()
    assert nc.stored == ["a1", "end", "b1"]
    assert nc.written == ["a1", "end", "end", "b1"]  # b1 went out only once the marker was stored
