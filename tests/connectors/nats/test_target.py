"""A sink's target (connectors/nats/target.py) and what it remembers (connectors/nats/state.py), against a
real NATS: prepared complete, a connection closed for good opened again, the initial backfill recorded."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from config.schema import SinkConfig
from connectors.nats.state import SinkMemory
from connectors.nats.target import SinkTarget
from core.runtime import Runtime
from core.subjects import database_subjects
from tests.harness import Nats, TestNames

runtime = Runtime()


def _sink(nats_srv: Nats, names: TestNames, **keys: Any) -> SinkConfig:
    return SinkConfig.model_validate({
        "name": "orders", "database": "app",
        "destination": {"type": "nats", **nats_srv.destination, "subject_prefix": names.subject_prefix,
                        "stream": {"name": names.stream}},
        **keys,
    })


@pytest.fixture
def target(nats_srv: Nats, names: TestNames, stream_cleanup: str) -> Iterator[SinkTarget]:
    """A sink's target, prepared as the flow's build prepares it; closed afterwards."""
    sink = _sink(nats_srv, names)
    prepared = SinkTarget.prepare(sink, "app", runtime, replay_from=0,
                                  scanned=database_subjects(sink.destination.subject_prefix, "app"))
    try:
        yield prepared
    finally:
        prepared.close()


def test_a_target_is_prepared_complete(target: SinkTarget, names: TestNames) -> None:
    assert target.stream.name == names.stream
    assert target.stream.subjects == (f"{names.subject_prefix}.app.>",)
    assert (target.skip, target.horizon) == (frozenset(), 0)
    assert target.scanned == f"{names.subject_prefix}.app.>"
    assert runtime.run(target.connection()).is_connected


def test_a_connection_closed_for_good_is_opened_again_with_its_stream(target: SinkTarget, names: TestNames) -> None:
    first = runtime.run(target.connection())
    runtime.run(first.close())
    again = runtime.run(target.connection())
    assert again is not first and again.is_connected
    assert target.stream.name == names.stream
    assert runtime.run(target.stored_since(1)) == set()


def test_the_initial_backfill_is_remembered_per_database_slot_and_sink(target: SinkTarget, names: TestNames) -> None:
    memory = SinkMemory(target.connection, runtime, "app", names.slot, "orders")
    assert not memory.initial_backfill_requested()
    memory.record_initial_backfill(["b1", "b2"])
    assert memory.initial_backfill_requested()
    assert SinkMemory(target.connection, runtime, "app", names.slot, "orders").initial_backfill_requested()
    # a new slot starts the sink anew, and another sink has its own entry
    assert not SinkMemory(target.connection, runtime, "app", f"{names.slot}_new", "orders").initial_backfill_requested()
    assert not SinkMemory(target.connection, runtime, "app", names.slot, "audit").initial_backfill_requested()
