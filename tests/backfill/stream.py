"""Reading a whole stream fast (an ordered consumer), and replaying it into table contents."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import nats
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.api import ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError

from tests.pipeline import Stored


def count(url: str, stream: str) -> int:
    """Messages in ``stream`` now (0 if it does not exist yet)."""

    async def run() -> int:
        nc = await nats.connect(url, connect_timeout=5, max_reconnect_attempts=0)
        try:
            return (await nc.jetstream().stream_info(stream)).state.messages
        except NotFoundError:
            return 0
        finally:
            await nc.close()

    return asyncio.run(run())


def read_all(url: str, stream: str) -> list[Stored]:
    """Every message of ``stream`` in stream order, through one ordered consumer."""

    async def run() -> list[Stored]:
        nc = await nats.connect(url, connect_timeout=5, max_reconnect_attempts=0)
        try:
            js = nc.jetstream()
            last = (await js.stream_info(stream)).state.last_seq
            out: list[Stored] = []
            if not last:
                return out
            sub = await js.subscribe(">", stream=stream, ordered_consumer=True,
                                     config=ConsumerConfig(deliver_policy=DeliverPolicy.ALL))
            try:
                while True:
                    try:
                        msg = await sub.next_msg(timeout=30)
                    except NatsTimeoutError:
                        raise AssertionError(f"stream {stream} stopped delivering before sequence {last}") from None
                    seq = msg.metadata.sequence.stream
                    out.append(Stored(seq, msg.subject, (msg.headers or {}).get("Nats-Msg-Id", ""), json.loads(msg.data)))
                    if seq >= last:
                        return out
            finally:
                await sub.unsubscribe()
        finally:
            await nc.close()

    return asyncio.run(run())


def replay(events: list[Stored], key: str = "id") -> dict[Any, dict[str, Any]]:
    """The table a consumer that applies every event in stream order ends with, by ``key``."""
    rows: dict[Any, dict[str, Any]] = {}
    for e in events:
        record = e.event["record"]
        if e.event["action"] == "delete":
            rows.pop(record[key], None)
        else:
            rows[record[key]] = record
    return rows
