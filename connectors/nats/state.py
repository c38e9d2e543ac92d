"""What a sink remembers outside the stream: that its ``initial_backfill`` was requested.

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
from typing import Final

from nats.js.api import KeyValueConfig
from nats.js.errors import BucketNotFoundError, KeyNotFoundError
from nats.js.kv import KeyValue

from connectors.nats.natspy import WalflowClient
from core.runtime import Runtime

#: The JetStream key-value bucket where walflow's sinks record what must outlive every run.
STATE_BUCKET: Final = "walflow_state"


class SinkMemory:
    """One sink's entries in :data:`STATE_BUCKET`, on the connection ``connection()`` gives."""

    def __init__(self, connection: Callable[[], Awaitable[WalflowClient]], runtime: Runtime, database: str,
                 slot: str, sink: str) -> None:
        """``connection``: the sink's (:meth:`connectors.nats.target.SinkTarget.connection`);
        ``runtime``: whose loop it lives on."""
        self._connection = connection
        self._runtime = runtime
        name = base64.urlsafe_b64encode(f"{database}/{slot}/{sink}".encode()).decode()
        self._initial_key: Final = f"initial_backfill.{name}"

    def initial_backfill_requested(self) -> bool:
        """Whether this sink's ``initial_backfill`` was requested before (by any earlier run)."""
        return self._runtime.run(self._initial_backfill()) is not None

    def record_initial_backfill(self, backfills: list[str]) -> None:
        """Remember that this sink's initial backfill was requested, so no restart repeats it."""
        async def record() -> None:
            bucket = await self._bucket()
            await bucket.put(self._initial_key, json.dumps({"backfills": backfills, "at": time.time()}).encode())

        self._runtime.run(record())

    async def _initial_backfill(self) -> bytes | None:
        bucket = await self._bucket()
        try:
            entry = await bucket.get(self._initial_key)
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
