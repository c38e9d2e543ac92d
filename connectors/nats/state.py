"""What a sink remembers outside the stream: that its ``initial_backfill`` was requested, and
the last time its stream was found to have lost acknowledged messages (``regression.py``).

It sits in walflow's JetStream key-value bucket :data:`STATE_BUCKET` on the sink's NATS (a
stream of its own, whichever stream the events land in; created on first use), under one key
per database, slot and sink: a sink started on a new slot is started anew.
``dataflows/initial_backfill.py`` asks, requests the backfills, then records.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any, Final

from nats.aio.client import Client
from nats.js.api import KeyValueConfig
from nats.js.errors import BucketNotFoundError, KeyNotFoundError
from nats.js.kv import KeyValue

from connectors.nats.natspy import WalflowClient
from core.runtime import Runtime

#: The JetStream key-value bucket where walflow's sinks record what must outlive every run.
STATE_BUCKET: Final = "walflow_state"


def _key(kind: str, database: str, slot: str, sink: str) -> str:
    return f"{kind}." + base64.urlsafe_b64encode(f"{database}/{slot}/{sink}".encode()).decode()


def regression_key(database: str, slot: str, sink: str) -> str:
    """The key of a sink's latest stream regression in :data:`STATE_BUCKET`."""
    return _key("regression", database, slot, sink)


async def recorded_regression(nc: Client, database: str, slot: str, sink: str) -> dict[str, Any] | None:
    """The sink's latest stream regression as recorded, read without creating anything (for
    ``walflow status``); None if there is none."""
    try:
        bucket = await nc.jetstream().key_value(STATE_BUCKET)
        entry = await bucket.get(regression_key(database, slot, sink))
    except (BucketNotFoundError, KeyNotFoundError):
        return None
    if entry.value is None:
        return None
    try:
        found = json.loads(entry.value)
    except ValueError:
        return None
    return found if isinstance(found, dict) else None


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
                bucket=STATE_BUCKET, history=1, description="walflow: what its sinks must remember (initial backfills)"))
