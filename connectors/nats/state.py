"""What a sink remembers outside the stream: that its ``initial_backfill`` was requested,
the last time its stream was found to have lost acknowledged messages (``regression.py``), and
for a sink with ``schema_events`` each table's shape and its last changes of shape
(``transforms/schema_events.py``: the baseline a restart compares against).

It sits in walflow's JetStream key-value bucket :data:`STATE_BUCKET` on the sink's NATS (a
stream of its own, whichever stream the events land in; created on first use), under one key
per database, slot and sink (a table's shape: one key per table under it): a sink started on a
new slot is started anew. ``dataflows/initial_backfill.py`` asks, requests the backfills, then
records.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Final, TypeVar

import nats.errors
from nats.aio.client import Client
from nats.js.api import KeyValueConfig
from nats.js.errors import BucketNotFoundError, KeyNotFoundError, NotFoundError
from nats.js.kv import KeyValue

from connectors.nats.connection import RateLimitedLog
from connectors.nats.natspy import WalflowClient
from core.runtime import Runtime

T = TypeVar("T")

#: The JetStream key-value bucket where walflow's sinks record what must outlive every run.
STATE_BUCKET: Final = "walflow_state"
#: What a request answers while NATS is away or JetStream has no leader: asked again.
_UNANSWERED: Final = (nats.errors.TimeoutError, asyncio.TimeoutError, nats.errors.NoRespondersError,
                      nats.errors.ConnectionClosedError)


def _key(kind: str, database: str, slot: str, sink: str) -> str:
    return f"{kind}." + base64.urlsafe_b64encode(f"{database}/{slot}/{sink}".encode()).decode()


def regression_key(database: str, slot: str, sink: str) -> str:
    """The key of a sink's latest stream regression in :data:`STATE_BUCKET`."""
    return _key("regression", database, slot, sink)


def schema_key(database: str, slot: str, sink: str, table: str | None = None) -> str:
    """The key of a table's shape record (``table``: ``schema.table``), or with None the pattern
    of every one of the sink's, in :data:`STATE_BUCKET`."""
    token = "*" if table is None else base64.urlsafe_b64encode(table.encode()).decode()
    return f"{_key('schema', database, slot, sink)}.{token}"


async def recorded_schemas(nc: Client, database: str, slot: str, sink: str) -> list[dict[str, Any]]:
    """Every table shape record of the sink, read without creating anything (for the flow's
    start and ``walflow status``): the bucket's stream lists the keys, a get reads each."""
    js = nc.jetstream()
    prefix = f"$KV.{STATE_BUCKET}."
    try:
        info = await js.stream_info(f"KV_{STATE_BUCKET}", subjects_filter=prefix + schema_key(database, slot, sink))
        bucket = await js.key_value(STATE_BUCKET)
    except (BucketNotFoundError, NotFoundError):
        return []
    found = []
    for subject in sorted(info.state.subjects or {}):
        try:
            entry = await bucket.get(subject[len(prefix):])
        except KeyNotFoundError:  # deleted, or purged since the listing
            continue
        record = _json_object(entry.value)
        if record is not None:
            found.append(record)
    return found


async def last_message(nc: Client, stream: str, subject: str) -> dict[str, Any] | None:
    """The last message on ``subject`` in ``stream`` as a JSON object; None if there is none, or it is not one."""
    try:
        return _json_object((await nc.jetstream().get_last_msg(stream, subject)).data)
    except NotFoundError:
        return None


def _json_object(value: bytes | None) -> dict[str, Any] | None:
    """``value`` as the JSON object walflow wrote; None for anything else (the bucket is anyone's)."""
    try:
        found = json.loads(value or b"")
    except ValueError:
        return None
    return found if isinstance(found, dict) else None


async def recorded_regression(nc: Client, database: str, slot: str, sink: str) -> dict[str, Any] | None:
    """The sink's latest stream regression as recorded, read without creating anything (for
    ``walflow status``); None if there is none."""
    try:
        bucket = await nc.jetstream().key_value(STATE_BUCKET)
        entry = await bucket.get(regression_key(database, slot, sink))
    except (BucketNotFoundError, KeyNotFoundError):
        return None
    return _json_object(entry.value)


class SinkMemory:
    """One sink's entries in :data:`STATE_BUCKET`, on the connection ``connection()`` gives."""

    def __init__(self, connection: Callable[[], Awaitable[WalflowClient]], runtime: Runtime, database: str,
                 slot: str, sink: str) -> None:
        """``connection``: the sink's (:meth:`connectors.nats.target.SinkTarget.connection`);
        ``runtime``: whose loop it lives on."""
        self._connection = connection
        self._runtime = runtime
        self._initial_key: Final = _key("initial_backfill", database, slot, sink)
        self._regression_key: Final = regression_key(database, slot, sink)
        self._names: Final = (database, slot, sink)
        self._warn = RateLimitedLog()

    def initial_backfill_requested(self) -> bool:
        """Whether this sink's ``initial_backfill`` was requested before (by any earlier run)."""
        return self._runtime.run(self._initial_backfill()) is not None

    def record_initial_backfill(self, backfills: list[str]) -> None:
        """Remember that this sink's initial backfill was requested, so no restart repeats it."""
        async def record() -> None:
            bucket = await self._bucket()
            await bucket.put(self._initial_key, json.dumps({"backfills": backfills, "at": time.time()}).encode())

        self._runtime.run(record())

    def record_regression(self, record: dict[str, Any]) -> None:
        """Remember the stream's latest regression (:meth:`Regression.as_json`) for ``walflow status``."""
        async def record_it() -> None:
            await (await self._bucket()).put(self._regression_key, json.dumps(record).encode())

        self._runtime.run(record_it())

    def schema_records(self) -> list[dict[str, Any]]:
        """Every table shape this sink recorded (:func:`recorded_schemas`)."""
        async def read() -> list[dict[str, Any]]:
            return await recorded_schemas(await self._connection(), *self._names)

        return self._patiently("reading its tables' shapes", read)

    def record_schema(self, table: str, record: dict[str, Any]) -> None:
        """Remember table ``table``'s (``schema.table``) shape record, replacing the last."""
        async def record_it() -> None:
            await (await self._bucket()).put(schema_key(*self._names, table), json.dumps(record).encode())

        self._patiently("recording a table's shape", record_it)

    def last_message(self, stream: str, subject: str) -> dict[str, Any] | None:
        """The last message on ``subject`` in ``stream`` (:func:`last_message`)."""
        async def read() -> dict[str, Any] | None:
            return await last_message(await self._connection(), stream, subject)

        return self._patiently("reading a table's last schema event", read)

    def _patiently(self, doing: str, make: Callable[[], Coroutine[Any, Any, T]]) -> T:
        """``make()``'s result, asked again with capped backoff while NATS does not answer: as the
        sink waits for NATS to publish, so does what it must know before it publishes."""
        async def ask() -> T:
            delay = 0.5
            while True:
                try:
                    return await make()
                except _UNANSWERED as exc:
                    self._warn(doing, "sink %s: NATS did not answer %s (%s); asking again", self._names[2], doing,
                               type(exc).__name__)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

        return self._runtime.run(ask())

    async def _initial_backfill(self) -> bytes | None:
        return await self._get(self._initial_key)

    async def _get(self, key: str) -> bytes | None:
        bucket = await self._bucket()
        try:
            entry = await bucket.get(key)
        except KeyNotFoundError:
            return None
        return entry.value

    async def _bucket(self) -> KeyValue:
        js = (await self._connection()).jetstream()
        try:
            return await js.key_value(STATE_BUCKET)
        except BucketNotFoundError:
            return await js.create_key_value(KeyValueConfig(
                bucket=STATE_BUCKET, history=1,
                description="walflow: what its sinks must remember (initial backfills, table shapes)"))
