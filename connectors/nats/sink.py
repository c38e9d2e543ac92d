"""The Bytewax sink: JetStream publishing in a fixed set of partitions routed by group key.

A ``FixedPartitionedSink`` (not a ``DynamicSink``): its snapshots are part of Bytewax's
recovery frontier, and a partition's ``snapshot()`` returns only once every message
written in the epoch has its JetStream acknowledgement. So when the source is called in
the next epoch, everything before its last snapshot is stored in JetStream: that is when
the slot may move (see ``connectors/postgres/source.py``).

Routing by group key keeps each group's messages in one partition, in order, across
workers and epochs. The sink only partitions and publishes: it is built complete from a
prepared :class:`connectors.nats.target.SinkTarget` (connection, stream, the ids to skip),
which all its partitions in one process share, and a render factory; each partition turns
its items into addressed :class:`core.message.Message` s and hands them to an
:class:`~connectors.nats.publisher.AckPublisher`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypedDict

from bytewax.outputs import FixedPartitionedSink, StatefulSinkPartition

from connectors.nats.atomic import AtomicPublisher
from connectors.nats.natspy import WalflowClient
from connectors.nats.publisher import AckPublisher, payload_room
from connectors.nats.target import SinkTarget
from core.events import BARRIER
from core.message import Message
from core.runtime import Runtime
from core.threads import keep_thread_state


class SinkState(TypedDict, total=False):
    """A partition's snapshot: the last stream sequence JetStream acknowledged to it, and the
    id of the message there (absent in snapshots of older versions): what a resumed partition
    checks the stream still holds (``regression.py``)."""

    last_seq: int
    last_id: str


#: Turns what a partition receives into the messages it publishes (``transforms/render.py``),
#: given what a message may take of its server's ``max_payload`` (:func:`payload_room`, read
#: for each batch: the server's limit may change with a reconnect).
Render = Callable[[list[Any], int], list[Message]]
#: Makes a partition's :data:`Render` (it holds per-partition state).
RenderFactory = Callable[[], Render]


class JetStreamPartition(StatefulSinkPartition[Any, SinkState]):
    def __init__(self, publisher: AckPublisher, nc: WalflowClient, label: str, runtime: Runtime,
                 render: Render | None, barriers: bool = False) -> None:
        """``barriers``: render may make :data:`~core.events.BARRIER` messages (markers, schema
        events); without, no message is looked at here."""
        self._publisher = publisher
        self._barriers = barriers
        self._nc = nc
        self._label = label
        self._runtime = runtime
        self._render = render

    def write_batch(self, items: list[Any]) -> None:
        with self._runtime.guard(f"{self._label}: publishing"):
            room = payload_room(self._nc.max_payload) - self._publisher.batch_headers
            messages = items if self._render is None else self._render(items, room)
            self._runtime.run(self._publish(messages) if self._barriers else self._publisher.publish(messages))

    async def _publish(self, messages: list[Message]) -> None:
        """Publish ``messages``; a :data:`~core.events.BARRIER` one only once all before it are
        stored, and nothing after it until it is: a barrier is rare (a transaction's markers, a
        schema event), and two settles order it against everything without the publisher's
        window knowing about it."""
        publisher, start = self._publisher, 0
        for i, message in enumerate(messages):
            if message.row == BARRIER:
                await publisher.publish(messages[start:i])
                await publisher.settle()
                await publisher.publish([message])
                await publisher.settle()
                start = i + 1
        await publisher.publish(messages[start:] if start else messages)

    def snapshot(self) -> SinkState:
        with self._runtime.guard(f"{self._label}: publishing"):
            self._runtime.run(self._publisher.settle())
        return {"last_seq": self._publisher.last_seq, "last_id": self._publisher.last_id}

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
    them as they are, :class:`~core.message.Message` s, without one.
    """

    def __init__(self, target: SinkTarget, render: RenderFactory | None = None, publishes: bool = True) -> None:
        """``target``: where the sink publishes, prepared (:meth:`SinkTarget.prepare`);
        ``render``: makes each partition's item → message step; ``publishes``: whether
        this process takes any of the sink's partitions (``dataflows/engine.py``: in a cluster,
        the processes that read slots may leave publishing to the others)."""
        self._target = target
        self._render = render
        self._publishes = publishes

    def list_parts(self) -> list[str]:
        keep_thread_state()  # Bytewax calls this once on every worker thread: see core/threads.py
        if not self._publishes:
            return []  # Bytewax gives a partition only to a worker that lists it
        sink = self._target.sink
        return [f"{sink.name}-{i}" for i in range(sink.partitions)]

    def part_fn(self, item_key: str) -> int:
        return int(item_key)  # the partition's index, chosen by the dispatch step

    def build_part(self, step_id: str, for_part: str, resume_state: SinkState | None) -> JetStreamPartition:
        keep_thread_state()
        target, runtime = self._target, self._target.runtime
        with runtime.guard(f"{for_part}: setting up"):
            dest = target.sink.destination
            nc = runtime.run(target.connection())
            publisher = (AtomicPublisher if target.sink.transactions == "atomic" else AckPublisher)(
                nc,
                window=dest.max_in_flight,
                ack_timeout=dest.ack_timeout_ms / 1000,
                label=for_part,
                skip=target.skip,
                on_no_stream=target.stream_again,
                stored_since=target.stored_since,
                duplicate_window=target.stream.duplicate_window,
                look=target.look,
                sink=target.sink.name,
                metrics=runtime.metrics,
            )
            runtime.run(publisher.start())
            if resume_state and "last_id" in resume_state and runtime.restarted is None:
                publisher.last_seq, publisher.last_id = resume_state["last_seq"], resume_state["last_id"]
            return JetStreamPartition(publisher, nc, for_part, runtime, None if self._render is None else self._render(),
                                      barriers=target.sink.transactions != "atomic"  # a batch is ordered whole
                                      and (target.sink.transaction_markers or target.sink.schema_events))
