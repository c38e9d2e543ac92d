"""The Bytewax sink: JetStream publishing in a fixed set of partitions routed by group key.

A ``FixedPartitionedSink`` (not a ``DynamicSink``): its snapshots are part of Bytewax's
recovery frontier, and a partition's ``snapshot()`` returns only once every message
written in the epoch has its JetStream acknowledgement. So when the source is called in
the next epoch, everything before its last snapshot is stored in JetStream: that is when
the slot may move (see ``connectors/postgres/source.py``).

Routing by group key keeps each group's messages in one partition, in order, across
workers and epochs. All partitions of a sink in one process share one NATS connection,
held by the sink object, like the ids its replay scan found; nothing is process-global.
The stream is the one that captures the sink's subjects (``connectors/nats/stream.py``),
whatever its name: everything that reads it (the replay scan, the check before a late
re-send) uses the one found. With ``msg_id: sequin`` the sink must be the only one with
Sequin's ids in that stream (:class:`SharedSequinIdsError`).
The one thing a sink remembers outside the stream — that its ``initial_backfill`` was
requested — sits in the ``walflow_state`` key-value bucket on the same NATS (a stream of
its own, whichever stream the events land in).
Messages arrive addressed (:class:`core.events.Message`: subject, payload, id, headers).

**Routed subjects and exactly-once.** The replay scan and the check before a late re-send
read the sink's own subjects, ``<prefix>.<database>.>``. A sink whose routing (or dead-letter
subject) may publish elsewhere (:func:`transforms.route.publishes_outside`) has them read
the whole stream instead: with ``msg_id: walflow`` its ids name database and sink, so
whatever else the stream holds is told apart by id. With ``msg_id: sequin`` the router keeps
every subject under ``<prefix>.<database>.``, so the sink's own subjects still hold all of
its messages.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, Final, TypedDict

from bytewax.outputs import FixedPartitionedSink, StatefulSinkPartition
from nats.js.api import KeyValueConfig
from nats.js.errors import BucketNotFoundError, KeyNotFoundError
from nats.js.kv import KeyValue

from config.schema import SinkConfig
from connectors.nats.connection import connect, permission_error
from connectors.nats.natspy import WalflowClient
from connectors.nats.publisher import AckPublisher, payload_room
from connectors.nats.replay import already_published, horizon, ids_since
from connectors.nats.stream import SinkStream, ensure_stream, stream_for
from core.errors import FatalError
from core.events import Message
from core.ids import IdScheme
from core.runtime import Runtime
from core.subjects import database_subjects
from core.threads import keep_thread_state
from transforms.route import publishes_outside

log = logging.getLogger("walflow.nats")

#: The JetStream key-value bucket where a sink records what must outlive every run and is
#: not the stream's business: that its initial backfill was requested.
STATE_BUCKET: Final = "walflow_state"


class SharedSequinIdsError(FatalError):
    """Two sinks with ``msg_id: sequin`` publish into one stream: JetStream would drop one's
    messages as duplicates of the other's, since Sequin's ids name a position only."""


class SinkState(TypedDict):
    """A partition's snapshot: the last stream sequence JetStream acknowledged to it."""

    last_seq: int


#: Turns what a partition receives into the messages it publishes (``transforms/render.py``).
Render = Callable[[list[Any]], list[Message]]
#: Makes a partition's :data:`Render`, given what a message may take of its server's ``max_payload``
#: (:func:`connectors.nats.publisher.payload_room`, read when each batch is rendered).
RenderFactory = Callable[[Callable[[], int]], Render]


class JetStreamPartition(StatefulSinkPartition[Any, SinkState]):
    def __init__(self, publisher: AckPublisher, label: str, runtime: Runtime, render: Render | None) -> None:
        self._publisher = publisher
        self._label = label
        self._runtime = runtime
        self._render = render

    def write_batch(self, items: list[Any]) -> None:
        with self._runtime.guard(f"{self._label}: publishing"):
            messages = items if self._render is None else self._render(items)
            self._runtime.run(self._publisher.publish(messages))

    def snapshot(self) -> SinkState:
        with self._runtime.guard(f"{self._label}: publishing"):
            self._runtime.run(self._publisher.settle())
        return {"last_seq": self._publisher.last_seq}

    def close(self) -> None:
        with self._runtime.guard(f"{self._label}: closing"):
            self._runtime.run(self._publisher.close())
            close = getattr(self._render, "close", None)  # a render may hold connections (enrichment)
            if close is not None:
                close()


class JetStreamSink(FixedPartitionedSink[Any, SinkState]):
    """Publishes the items of one configured sink, keyed by partition index.

    An item's key is the index of its partition (``transforms/dispatch.py`` picks it from
    the group key): :meth:`part_fn` reads it back. Each partition turns its items into
    messages with its own ``render()`` (the flow's: conversion and envelope), or publishes
    them as they are, :class:`~core.events.Message` s, without one.
    """

    def __init__(
        self,
        sink: SinkConfig,
        database: str,
        replay_from: int,
        runtime: Runtime,
        slot: str = "",
        peers: Sequence[SinkConfig] = (),
        render: RenderFactory | None = None,
        publishes: bool = True,
    ) -> None:
        """``database``: the configured name of the database the changes come from;
        ``replay_from``: the slot's confirmed LSN, where the source resumes (or before it);
        ``runtime``: the process's, whose loop the NATS connection lives on;
        ``peers``: the config's sinks, of every database (this one may be among them),
        which a sink with ``msg_id: sequin`` must not share its stream with;
        ``render``: makes each partition's item → message step (it holds per-partition state), given
        what a message may take of the server's ``max_payload``;
        ``publishes``: whether this process takes any of the sink's partitions
        (``dataflows/engine.py``: in a cluster, the processes that read slots may leave
        publishing to the others; the sink still connects, for its replay horizon)."""
        self.render = render
        self.publishes = publishes
        self.sink = sink
        self.database = database
        self.slot = slot
        self.replay_from = replay_from
        self.runtime = runtime
        self.peers = peers
        dest = sink.destination
        self.ids = IdScheme(database, sink.name, dest.msg_id)
        #: Every subject this sink publishes on unrouted: also what tells its messages from
        #: others' in the stream when its ids are Sequin's, which name no sink.
        self.subjects = database_subjects(dest.subject_prefix, database)
        #: What the replay scan and late re-sends read: the sink's subjects, or the whole stream
        #: when its routing may publish outside them (the module's docstring).
        self.scanned = ">" if dest.msg_id == "walflow" and publishes_outside(sink, database) else self.subjects
        #: The stream its events land in, once connected.
        self.stream: SinkStream | None = None
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
                nc = await connect(dest, name=f"walflow:{self.sink.name}", metrics=self.runtime.metrics)
                try:
                    stream = self.stream = await ensure_stream(nc, dest, self.database)
                    await self._check_msg_ids(nc, stream.name)
                    if self._published is None:
                        found = await already_published(nc, stream.name, self.scanned, self.ids, self.replay_from)
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

    async def _check_msg_ids(self, nc: WalflowClient, stream: str) -> None:
        """With ``msg_id: sequin``, refuse to start when another sink with Sequin's ids
        publishes into the same stream (on a NATS this sink shares a server with)."""
        if self.ids.msg_id != "sequin":
            return
        servers = set(self.sink.destination.server_urls)
        for peer in self.peers:
            dest = peer.destination
            if (peer.name, peer.database) == (self.sink.name, self.database) or not peer.enabled:
                continue
            if dest.msg_id != "sequin" or not servers & set(dest.server_urls):
                continue
            if await stream_for(nc, dest, peer.database) != stream:
                continue
            if peer.database == self.database:
                who = f"sinks '{self.sink.name}' and '{peer.name}' of database '{self.database}'"
                clash = "JetStream would drop one sink's messages as duplicates of the other's"
            else:
                who = (f"sinks '{self.sink.name}' (database '{self.database}') and '{peer.name}' "
                       f"(database '{peer.database}')")
                clash = ("they do not name the database either, so JetStream would drop one database's changes "
                         "as duplicates of the other's wherever their positions coincide")
            raise SharedSequinIdsError(
                f"{who} both publish into JetStream stream '{stream}' with destination.msg_id: sequin, whose ids "
                f"name a change by its commit position only: {clash}. Set msg_id: walflow on one of them (its ids "
                "name database and sink), or have it publish into another stream"
            )

    async def _stream_again(self, nc: WalflowClient) -> None:
        """The stream vanished while running (JetStream answered "no responders"): set it up again."""
        self.stream = await ensure_stream(nc, self.sink.destination, self.database)

    def _current_stream(self) -> SinkStream:
        assert self.stream is not None, "the stream is set up before any partition is built"
        return self.stream

    def stream_subjects(self) -> tuple[str, ...]:
        """What the sink's stream captures, once :meth:`prepare` found it: where its routed
        subjects must stay (:class:`transforms.route.Router`)."""
        return self._current_stream().subjects

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
        if not self.publishes:
            return []  # Bytewax gives a partition only to a worker that lists it
        return [f"{self.sink.name}-{i}" for i in range(self.sink.partition_count)]

    def part_fn(self, item_key: str) -> int:
        return int(item_key)  # the partition's index, chosen by the dispatch step

    def build_part(self, step_id: str, for_part: str, resume_state: SinkState | None) -> JetStreamPartition:
        keep_thread_state()
        with self.runtime.guard(f"{for_part}: setting up"):
            dest = self.sink.destination
            nc = self.runtime.run(self._connection())
            publisher = AckPublisher(
                nc,
                window=dest.max_in_flight,
                ack_timeout=dest.ack_timeout_ms / 1000,
                label=for_part,
                skip=self._published or frozenset(),
                on_no_stream=lambda: self._stream_again(nc),
                stored_since=lambda seq: ids_since(nc, self._current_stream().name, self.scanned, seq),
                duplicate_window=self._current_stream().duplicate_window,
                sink=self.sink.name,
                metrics=self.runtime.metrics,
            )
            self.runtime.run(publisher.start())
            if resume_state:
                publisher.last_seq = resume_state["last_seq"]
            render = None if self.render is None else self.render(lambda: payload_room(nc.max_payload))
            return JetStreamPartition(publisher, for_part, self.runtime, render)
