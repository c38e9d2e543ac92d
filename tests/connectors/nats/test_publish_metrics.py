"""What the publisher counts, against a real NATS: acknowledgements, latency, retries, failures, reconnects."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from config.schema import NatsDestination
from connectors.nats.connection import connect
from connectors.nats.natspy import WalflowClient
from connectors.nats.publisher import AckPublisher
from connectors.nats.stream import ensure_stream
from core.message import Message
from core.metrics import Metrics
from core.runtime import Runtime
from embedded import wait_for
from tests.connectors.nats.clients import message
from tests.harness import Nats, TestNames

runtime = Runtime()


def _value(metrics: Metrics, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels`` (0 if none), parsed from the exposition."""
    total = 0.0
    for family in text_string_to_metric_families(metrics.exposition().decode()):
        for sample in family.samples:
            if sample.name == name and labels.items() <= sample.labels.items():
                total += sample.value
    return total


@pytest.fixture
def dest(nats_srv: Nats, names: TestNames, stream_cleanup: str) -> NatsDestination:
    return NatsDestination.model_validate({
        "type": "nats", **nats_srv.destination, "subject_prefix": names.subject_prefix,
        "stream": {"name": names.stream}, "ack_timeout_ms": 2000,
    })


@pytest.fixture
def metrics() -> Metrics:
    return Metrics()


@pytest.fixture
def nc(dest: NatsDestination, metrics: Metrics) -> Iterator[WalflowClient]:
    client = runtime.run(connect(dest, name="walflow-test", metrics=metrics))
    try:
        yield client
    finally:
        runtime.run(client.close())


def _publisher(nc: WalflowClient, names: TestNames, metrics: Metrics, window: int = 64) -> AckPublisher:
    publisher = AckPublisher(nc, window=window, ack_timeout=2.0, label="orders-0", sink="orders", metrics=metrics)
    runtime.run(publisher.start())
    return publisher


def _message(prefix: str, table: str, action: str, i: int, commit_ts: float) -> Message:
    return message(prefix, table, action, f'{{"i": {i}}}'.encode(), f"{table}-{action}-{i}", commit_ts)


def test_acknowledged_messages_are_counted_by_table_and_action_with_their_latency(
    nc: WalflowClient, dest: NatsDestination, names: TestNames, metrics: Metrics
) -> None:
    runtime.run(ensure_stream(nc, dest, "app"))
    publisher = _publisher(nc, names, metrics, window=8)  # a small window: acks are flushed as it refills
    old, now = time.time() - 100, time.time()
    messages = [_message(names.subject_prefix, "t", "insert", i, old) for i in range(30)]
    messages += [_message(names.subject_prefix, "u", "update", i, now) for i in range(5)]
    messages += [_message(names.subject_prefix, "t", "read", i, 0.0) for i in range(3)]  # a backfill's read has no commit time
    runtime.run(publisher.publish(messages))
    runtime.run(publisher.settle())
    published = "walflow_changes_published_total"
    assert _value(metrics, published, sink="orders", table="public.t", action="insert") == 30
    assert _value(metrics, published, sink="orders", table="public.u", action="update") == 5
    assert _value(metrics, published, sink="orders", table="public.t", action="read") == 3
    runtime.run(publisher.publish(messages[:4]))  # a replay: JetStream acknowledges the duplicates
    runtime.run(publisher.settle())
    assert _value(metrics, published, sink="orders") == 42
    latency = "walflow_commit_to_ack_seconds"
    assert _value(metrics, f"{latency}_count", sink="orders") == 39  # changes only, not the reads
    assert _value(metrics, f"{latency}_bucket", sink="orders", le="30.0") == 5  # committed just now
    assert _value(metrics, f"{latency}_bucket", sink="orders", le="60.0") == 5
    assert _value(metrics, f"{latency}_bucket", sink="orders", le="120.0") == 39  # committed 100 s before
    assert _value(metrics, f"{latency}_sum", sink="orders") > 34 * 100
    assert _value(metrics, "walflow_sink_window_messages", sink="orders") == 0  # all acknowledged
    assert _value(metrics, "walflow_sink_window_limit_messages", sink="orders") == 8
    assert _value(metrics, "walflow_backpressure_seconds_total", bound="sink_window") > 0  # 38 through a window of 8
    assert _value(metrics, "walflow_publish_retries_total") == 0


def test_error_acknowledgements_count_by_code_and_their_resends_as_retries(
    nc: WalflowClient, dest: NatsDestination, names: TestNames, metrics: Metrics
) -> None:
    """No stream captures the subjects yet: JetStream answers 503 until one does."""
    publisher = _publisher(nc, names, metrics)
    messages = [_message(names.subject_prefix, "t", "insert", i, time.time()) for i in range(3)]
    done = threading.Event()

    def publish() -> None:
        runtime.run(publisher.publish(messages))
        runtime.run(publisher.settle())
        done.set()

    worker = threading.Thread(target=publish)
    worker.start()
    wait_for(lambda: _value(metrics, "walflow_publish_failures_total", sink="orders", code="503") >= 3, timeout=30,
             what="503s to be counted")
    assert not done.is_set()
    runtime.run(ensure_stream(nc, dest, "app"))
    worker.join(60)
    assert done.is_set()
    failures = _value(metrics, "walflow_publish_failures_total", sink="orders", code="503")
    assert failures % 3 == 0  # every round, each message
    assert _value(metrics, "walflow_publish_retries_total", sink="orders", reason="jetstream_error") == failures
    assert _value(metrics, "walflow_changes_published_total", sink="orders") == 3


@pytest.mark.slow
def test_a_nats_outage_counts_a_reconnect_and_the_resends(
    nc: WalflowClient, dest: NatsDestination, names: TestNames, metrics: Metrics, nats_srv: Nats
) -> None:
    runtime.run(ensure_stream(nc, dest, "app"))
    publisher = _publisher(nc, names, metrics)
    nats_srv.stop()
    wait_for(lambda: not nc.is_connected, timeout=10, what="the client to notice")
    worker = threading.Thread(
        target=lambda: (runtime.run(publisher.publish([_message(names.subject_prefix, "t", "insert", 1, time.time())])),
                        runtime.run(publisher.settle())))
    worker.start()  # sent while disconnected: re-sent once NATS is back
    time.sleep(1.0)
    nats_srv.start()
    worker.join(60)
    assert not worker.is_alive()
    # the server went away: its socket closed (eof), or reset under a write in flight (network)
    assert sum(_value(metrics, "walflow_reconnects_total", component="nats", cause=cause)
               for cause in ("eof", "network")) == 1
    assert _value(metrics, "walflow_publish_retries_total", sink="orders", reason="disconnected") >= 1
    assert _value(metrics, "walflow_changes_published_total", sink="orders") == 1


def test_routed_messages_are_counted_by_their_table_and_action_not_their_subject(
    nats_srv: Nats, names: TestNames, metrics: Metrics, stream_cleanup: str
) -> None:
    """A routed subject is a message's own (one per tenant, or one shared by every table):
    its acknowledgement counts under the message's table and action, like a default one's."""
    prefix = names.subject_prefix
    dest = NatsDestination.model_validate({
        "type": "nats", **nats_srv.destination, "subject_prefix": prefix, "ack_timeout_ms": 2000,
        "stream": {"name": names.stream, "subjects": [f"{prefix}.app.>", f"{prefix}.all"]},
    })
    client = runtime.run(connect(dest, name="walflow-test", metrics=metrics))
    try:
        runtime.run(ensure_stream(client, dest, "app"))
        publisher = _publisher(client, names, metrics)
        shared = f"{prefix}.all".encode()
        messages = [
            *(_message(prefix, "t", "insert", i, 0.0) for i in range(3)),  # on the default subject
            *(message(prefix, "t", "insert", b"{}", f"tenant-{i}", subject=f"{prefix}.app.tenant.{i}".encode())
              for i in range(4)),  # a subject per row
            *(message(prefix, "u", "update", b"{}", f"u-{i}", subject=shared, headers=b"X-A: 1\r\n") for i in range(2)),
            message(prefix, "t", "delete", b"{}", "t-shared", subject=shared),  # the same subject, another table
        ]
        runtime.run(publisher.publish(messages))
        runtime.run(publisher.settle())
    finally:
        runtime.run(client.close())
    published = "walflow_changes_published_total"
    assert _value(metrics, published, sink="orders", table="public.t", action="insert") == 7
    assert _value(metrics, published, sink="orders", table="public.u", action="update") == 2
    assert _value(metrics, published, sink="orders", table="public.t", action="delete") == 1
    assert len(publisher._published._children) == 3  # one per table and action, not per routed subject
    assert _value(metrics, published, sink="orders") == 10
