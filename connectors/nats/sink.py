"""The Bytewax sink: JetStream publishing in a fixed set of partitions routed by group key.

A ``FixedPartitionedSink`` (not a ``DynamicSink``): its snapshots are part of Bytewax's
recovery frontier, and a partition's ``snapshot()`` returns only once every message
written in the epoch has its JetStream acknowledgement. So when the source is called in
the next epoch, everything before its last snapshot is stored in JetStream: that is when
the slot may move (see ``connectors/postgres/source.py``).

Routing by group key keeps each group's messages in one partition, in order, across
workers and epochs. All partitions of a sink in one process share one NATS connection.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TypedDict

from bytewax.outputs import FixedPartitionedSink, StatefulSinkPartition

from config.schema import SinkConfig
from connectors.nats import runtime
from connectors.nats.connection import WalflowClient, connect
from connectors.nats.messages import NatsMessage
from connectors.nats.publisher import AckPublisher
from connectors.nats.replay import already_published, horizon, ids_since
from connectors.nats.stream import ensure_stream

log = logging.getLogger("walflow.nats")

_connections: dict[str, WalflowClient] = {}
_published: dict[str, frozenset[str]] = {}
_lock: asyncio.Lock | None = None


class SinkState(TypedDict):
    """A partition's snapshot: the last stream sequence JetStream acknowledged to it."""

    last_seq: int


async def _connection(
    sink: SinkConfig, database: str, escaped_database: str, replay_from: int, key_prefix: str
) -> WalflowClient:
    """This process's connection for ``sink``, with the stream checked and its tail read once."""
    global _lock
    if _lock is None:
        _lock = asyncio.Lock()
    async with _lock:
        nc = _connections.get(sink.name)
        if nc is None or nc.is_closed:
            dest = sink.destination
            nc = await connect(dest, name=f"walflow:{sink.name}")
            await ensure_stream(nc, dest, database, escaped_database)
            if sink.name not in _published:
                ids = await already_published(
                    nc, dest.stream.name, f"{dest.subject_prefix}.{escaped_database}.>",
                    key_prefix, replay_from,
                )
                if ids:
                    log.info("%s: %d change(s) to be replayed are already in the stream; not publishing them again",
                             sink.name, len(ids))
                _published[sink.name] = frozenset(ids)
            _connections[sink.name] = nc
        return nc


class JetStreamPartition(StatefulSinkPartition[NatsMessage, SinkState]):
    def __init__(self, publisher: AckPublisher, label: str) -> None:
        self._publisher = publisher
        self._label = label

    def write_batch(self, items: list[NatsMessage]) -> None:
        try:
            runtime.run(self._publisher.publish(items))
        except Exception:
            log.exception("%s: publishing failed", self._label)  # Bytewax clusters hide the cause
            raise

    def snapshot(self) -> SinkState:
        try:
            runtime.run(self._publisher.settle())
        except Exception:
            log.exception("%s: publishing failed", self._label)
            raise
        return {"last_seq": self._publisher.last_seq}

    def close(self) -> None:
        runtime.run(self._publisher.close())


class JetStreamSink(FixedPartitionedSink[NatsMessage, SinkState]):
    """Publishes ``(group key, NatsMessage)`` items of one configured sink."""

    def __init__(
        self, sink: SinkConfig, database: str, escaped_database: str, replay_from: int, key_prefix: str
    ) -> None:
        """``replay_from``: the slot's confirmed LSN, where the source resumes (or before it);
        ``key_prefix``: how this sink's message ids start (``transforms.envelope.key_prefix``)."""
        self.sink = sink
        self.database = database
        self.escaped_database = escaped_database
        self.replay_from = replay_from
        self.key_prefix = key_prefix

    def prepare(self) -> int:
        """Connect and check the stream now, at startup, rather than at the first message
        (Bytewax builds sink partitions lazily): waits while NATS is unreachable. Returns
        the replay horizon: the source must not confirm a position up to it (replay.py)."""
        runtime.run(_connection(self.sink, self.database, self.escaped_database, self.replay_from, self.key_prefix))
        return horizon(set(_published.get(self.sink.name, frozenset())), self.key_prefix)

    def list_parts(self) -> list[str]:
        return [f"{self.sink.name}-{i}" for i in range(self.sink.partition_count)]

    def build_part(self, step_id: str, for_part: str, resume_state: SinkState | None) -> JetStreamPartition:
        dest = self.sink.destination
        nc = runtime.run(_connection(self.sink, self.database, self.escaped_database, self.replay_from, self.key_prefix))
        publisher = AckPublisher(
            nc,
            window=dest.max_in_flight,
            ack_timeout=dest.ack_timeout_ms / 1000,
            label=for_part,
            skip=_published.get(self.sink.name, frozenset()),
            on_no_stream=lambda: ensure_stream(nc, dest, self.database, self.escaped_database),
            stored_since=lambda seq: ids_since(nc, dest.stream.name, f"{dest.subject_prefix}.{self.escaped_database}.>",
                                               seq),
            duplicate_window=dest.stream.duplicate_window_ms / 1000,
        )
        runtime.run(publisher.start())
        if resume_state:
            publisher.last_seq = resume_state["last_seq"]
        return JetStreamPartition(publisher, for_part)
