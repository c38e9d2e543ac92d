"""The Bytewax sink: JetStream publishing in a fixed set of partitions routed by group key.

A ``FixedPartitionedSink`` (not a ``DynamicSink``): its snapshots are part of Bytewax's
recovery frontier, and a partition's ``snapshot()`` returns only once every message
written in the epoch has its JetStream acknowledgement. So when the source is called in
the next epoch, everything before its last snapshot is stored in JetStream: that is when
the slot may move (see ``connectors/postgres/source.py``).

Routing by group key keeps each group's messages in one partition, in order, across
workers and epochs. All partitions of a sink in one process share one NATS connection,
held by the sink object, like the ids its replay scan found; nothing is process-global.
The one thing a sink remembers outside the stream — that its ``initial_backfill`` was
requested — sits in the ``walflow_state`` key-value bucket on the same NATS.
Messages arrive as payload and id (:class:`core.events.Message`); the publisher gives
each its subject.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import time
from typing import Final, TypedDict

from bytewax.outputs import FixedPartitionedSink, StatefulSinkPartition
from nats.js.api import KeyValueConfig
from nats.js.errors import BucketNotFoundError, KeyNotFoundError
from nats.js.kv import KeyValue

from config.schema import SinkConfig
from connectors.nats.connection import connect, permission_error
from connectors.nats.natspy import WalflowClient
from connectors.nats.publisher import AckPublisher
from connectors.nats.replay import already_published, horizon, ids_since
from connectors.nats.stream import ensure_stream
from core.errors import FatalError
from core.events import Message
from core.ids import IdScheme
from core.runtime import Runtime
from core.threads import keep_thread_state
from core.tokens import escape_token

log = logging.getLogger("walflow.nats")

#: The JetStream key-value bucket where a sink records what must outlive every run and is
#: not the stream's business: that its initial backfill was requested.
STATE_BUCKET: Final = "walflow_state"


class SinkState(TypedDict):
    """A partition's snapshot: the last stream sequence JetStream acknowledged to it."""

    last_seq: int


class JetStreamPartition(StatefulSinkPartition[Message, SinkState]):
    def __init__(self, publisher: AckPublisher, label: str, runtime: Runtime) -> None:
        self._publisher = publisher
        self._label = label
        self._runtime = runtime

    def write_batch(self, items: list[Message]) -> None:
        with self._runtime.guard(f"{self._label}: publishing"):
            self._runtime.run(self._publisher.publish(items))

    def snapshot(self) -> SinkState:
        with self._runtime.guard(f"{self._label}: publishing"):
            self._runtime.run(self._publisher.settle())
        return {"last_seq": self._publisher.last_seq}

    def close(self) -> None:
        with self._runtime.guard(f"{self._label}: closing"):
            self._runtime.run(self._publisher.close())


class JetStreamSink(FixedPartitionedSink[Message, SinkState]):
    """Publishes ``(group key, Message)`` items of one configured sink."""

    def __init__(self, sink: SinkConfig, database: str, replay_from: int, runtime: Runtime, slot: str = "") -> None:
        """``database``: the configured name of the database the changes come from;
        ``replay_from``: the slot's confirmed LSN, where the source resumes (or before it);
        ``runtime``: the process's, whose loop the NATS connection lives on."""
        self.sink = sink
        self.database = database
        self.slot = slot
        self.replay_from = replay_from
        self.runtime = runtime
        self.ids = IdScheme(database, sink.name)
        dest = sink.destination
        #: Every subject this sink publishes on.
        self.subjects = f"{dest.subject_prefix}.{escape_token(database)}.>"
        self._nc: WalflowClient | None = None
        #: Ids of changes to be replayed that the stream already holds (read once).
        self._published: frozenset[str] | None = None
        self._lock = asyncio.Lock()  # on the runtime's loop: partitions connect from several workers

    async def _connection(self) -> WalflowClient:
        """The sink's connection, with the stream checked and its tail read once."""
        async with self._lock:
            nc = self._nc
            if nc is None or nc.is_closed:
                dest = self.sink.destination
                nc = await connect(dest, name=f"walflow:{self.sink.name}")
                try:
                    await ensure_stream(nc, dest, self.database, escape_token(self.database))
                    if self._published is None:
                        found = await already_published(
                            nc, dest.stream.name, self.subjects, self.ids, self.replay_from
                        )
                        if found:
                            log.info("%s: %d change(s) to be replayed are already in the stream; "
                                     "not publishing them again", self.sink.name, len(found))
                        self._published = frozenset(found)
                except FatalError:
                    raise
                except Exception as exc:
                    denied = permission_error(nc, dest, f"a JetStream API request of sink '{self.sink.name}'")
                    if denied is not None:
                        raise denied from exc
                    raise
                self._nc = nc
            return nc

    def prepare(self) -> int:
        """Connect and check the stream now, at startup, rather than at the first message
        (Bytewax builds sink partitions lazily): waits while NATS is unreachable. Returns
        the replay horizon: the source must not confirm a position up to it (replay.py)."""
        self.runtime.run(self._connection())
        return horizon(self._published or frozenset(), self.ids)

    # -- what the sink remembers beyond the stream ------------------------------------------

    def initial_backfill_requested(self) -> bool:
        """Whether this sink's ``initial_backfill`` was requested before (by any earlier run)."""
        return self.runtime.run(self._initial_backfill()) is not None

    def record_initial_backfill(self, backfills: list[str]) -> None:
        """Remember that this sink's initial backfill was requested, so no restart repeats it."""
        async def record() -> None:
            bucket = await self._state_bucket()
            await bucket.put(self._initial_key, json.dumps({"backfills": backfills, "at": time.time()}).encode())

        self.runtime.run(record())

    @property
    def _initial_key(self) -> str:
        # per slot too: a sink started on a new slot is started anew
        name = base64.urlsafe_b64encode(f"{self.database}/{self.slot}/{self.sink.name}".encode()).decode()
        return f"initial_backfill.{name}"

    async def _initial_backfill(self) -> bytes | None:
        bucket = await self._state_bucket()
        try:
            entry = await bucket.get(self._initial_key)
        except KeyNotFoundError:
            return None
        return entry.value

    async def _state_bucket(self) -> KeyValue:
        """walflow's key-value bucket on the sink's NATS (created on first use)."""
        js = (await self._connection()).jetstream()
        try:
            return await js.key_value(STATE_BUCKET)
        except BucketNotFoundError:
            return await js.create_key_value(KeyValueConfig(
                bucket=STATE_BUCKET, history=1, description="walflow: what its sinks must remember (initial backfills)"))

    def list_parts(self) -> list[str]:
        keep_thread_state()  # Bytewax calls this once on every worker thread: see core/threads.py
        return [f"{self.sink.name}-{i}" for i in range(self.sink.partition_count)]

    def build_part(self, step_id: str, for_part: str, resume_state: SinkState | None) -> JetStreamPartition:
        keep_thread_state()
        with self.runtime.guard(f"{for_part}: setting up"):
            dest = self.sink.destination
            nc = self.runtime.run(self._connection())
            publisher = AckPublisher(
                nc,
                subject_prefix=dest.subject_prefix,
                database=self.database,
                window=dest.max_in_flight,
                ack_timeout=dest.ack_timeout_ms / 1000,
                label=for_part,
                skip=self._published or frozenset(),
                on_no_stream=lambda: ensure_stream(nc, dest, self.database, escape_token(self.database)),
                stored_since=lambda seq: ids_since(nc, dest.stream.name, self.subjects, seq),
                duplicate_window=dest.stream.duplicate_window_ms / 1000,
            )
            self.runtime.run(publisher.start())
            if resume_state:
                publisher.last_seq = resume_state["last_seq"]
            return JetStreamPartition(publisher, for_part, self.runtime)
