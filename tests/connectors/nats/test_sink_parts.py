"""The sink only partitions and publishes: its parts, from a target, without servers."""

from __future__ import annotations

from config.schema import SinkConfig
from connectors.nats.natspy import WalflowClient
from connectors.nats.sink import JetStreamSink
from connectors.nats.stream import SinkStream
from connectors.nats.target import SinkTarget
from core.runtime import Runtime


def _target(partitions: int = 3) -> SinkTarget:
    sink = SinkConfig.model_validate({"name": "orders", "database": "app", "partition_count": partitions,
                                      "destination": {"type": "nats", "host": "nats"}})
    return SinkTarget(sink, "app", Runtime(), scanned="sequin.app.>", peers=(), nc=WalflowClient(),
                      stream=SinkStream("WALFLOW", 120.0, ("sequin.app.>",)), skip=frozenset())


def test_a_sink_lists_its_partitions_and_routes_by_the_items_key() -> None:
    sink = JetStreamSink(_target(3))
    assert sink.list_parts() == ["orders-0", "orders-1", "orders-2"]
    assert sink.part_fn("2") == 2


def test_a_process_that_does_not_publish_lists_no_partition() -> None:
    assert JetStreamSink(_target(), publishes=False).list_parts() == []


def test_a_sink_is_built_complete() -> None:
    """Nothing is assigned to it after construction: it has no attribute a flow could set later."""
    sink = JetStreamSink(_target(), render=None)
    assert set(vars(sink)) == {"_target", "_render", "_publishes"}
