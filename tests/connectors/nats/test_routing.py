"""Routed messages against a real NATS: stored on their subjects with their headers and walflow's
``Nats-Msg-Id``, and found by the replay scan of a sink that routes outside its database's subjects."""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from config.schema import NatsDestination, SinkConfig
from connectors.nats.connection import connect
from connectors.nats.natspy import WalflowClient
from connectors.nats.publisher import AckPublisher, payload_room
from connectors.nats.sink import JetStreamSink
from connectors.nats.stream import ensure_stream
from connectors.nats.target import SinkTarget
from core.errors import PermanentPublishError
from core.ids import IdScheme
from core.runtime import Runtime
from tests.connectors.nats.clients import message
from tests.harness import Nats, TestNames
from transforms.route import replay_subjects

runtime = Runtime()


def _destination(nats_srv: Nats, names: TestNames, **keys: Any) -> dict[str, Any]:
    prefix = names.subject_prefix
    return {"type": "nats", **nats_srv.destination, "subject_prefix": prefix, "ack_timeout_ms": 2000,
            "stream": {"name": names.stream, "subjects": [f"{prefix}.app.>", f"{prefix}.tenants.>"]}, **keys}


@pytest.fixture
def dest(nats_srv: Nats, names: TestNames, stream_cleanup: str) -> NatsDestination:
    return NatsDestination.model_validate(_destination(nats_srv, names))


@pytest.fixture
def nc(dest: NatsDestination) -> Iterator[WalflowClient]:
    client = runtime.run(connect(dest, name="walflow-test"))
    try:
        runtime.run(ensure_stream(client, dest, "app"))
        yield client
    finally:
        runtime.run(client.close())


def _publisher(nc: WalflowClient, names: TestNames) -> AckPublisher:
    publisher = AckPublisher(nc, window=64, ack_timeout=2.0, label="test")
    runtime.run(publisher.start())
    return publisher


async def _stored(nc: WalflowClient, stream: str) -> list[tuple[str, bytes, bytes]]:
    """Subject, payload and the header block of every message in ``stream``, as JetStream keeps
    them (nats-py's own header parser would turn a UTF-8 value into an ``email`` object)."""
    info = await nc.jetstream().stream_info(stream)
    out = []
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        reply = await nc.request(f"$JS.API.STREAM.MSG.GET.{stream}", json.dumps({"seq": seq}).encode(), timeout=5)
        stored = json.loads(reply.data)["message"]
        out.append((stored["subject"], base64.b64decode(stored.get("data", "")), base64.b64decode(stored["hdrs"])))
    return out


def test_routed_messages_land_on_their_subjects_with_their_headers_and_walflows_id(
    nc: WalflowClient, names: TestNames
) -> None:
    prefix = names.subject_prefix
    publisher = _publisher(nc, names)
    messages = [
        message(prefix, "t", "insert", b'{"i":0}', "id-0"),
        message(prefix, "t", "insert", b'{"i":1}', "id-1", subject=f"{prefix}.tenants.acme".encode(),
                headers=b'X-Tenant: acme\r\nWf-Key: ["1"]\r\n'),
        message(prefix, "t", "update", b'{"i":2}', "id-2", headers=b"X-Only: headers\r\n"),  # the default subject
        message(prefix, "u", "delete", b'{"i":3}', "id-3"),
        message(prefix, "t", "insert", "{\"é\":4}".encode(), "id-4", subject=f"{prefix}.tenants.café".encode(),
                headers="X-Name: café\r\n".encode()),
    ]
    runtime.run(publisher.publish(messages[:1]))
    runtime.run(publisher.publish(messages[1:]))
    runtime.run(publisher.settle())
    assert publisher.last_seq == 5
    assert runtime.run(_stored(nc, names.stream)) == [
        (f"{prefix}.app.public.t.insert", b'{"i":0}', b"NATS/1.0\r\nNats-Msg-Id: id-0\r\n\r\n"),
        (f"{prefix}.tenants.acme", b'{"i":1}', b'NATS/1.0\r\nNats-Msg-Id: id-1\r\nX-Tenant: acme\r\nWf-Key: ["1"]\r\n\r\n'),
        (f"{prefix}.app.public.t.update", b'{"i":2}', b"NATS/1.0\r\nNats-Msg-Id: id-2\r\nX-Only: headers\r\n\r\n"),
        (f"{prefix}.app.public.u.delete", b'{"i":3}', b"NATS/1.0\r\nNats-Msg-Id: id-3\r\n\r\n"),
        (f"{prefix}.tenants.café", "{\"é\":4}".encode(), "NATS/1.0\r\nNats-Msg-Id: id-4\r\nX-Name: café\r\n\r\n".encode()),
    ]
    runtime.run(publisher.publish(messages[1:2]))  # a replay of a routed message: dropped by its id
    runtime.run(publisher.settle())
    assert len(runtime.run(_stored(nc, names.stream))) == 5


def test_max_payload_counts_a_routed_messages_headers(nc: WalflowClient, names: TestNames) -> None:
    """As render counts them before (``payload_room``): a message it lets through is never refused here."""
    prefix = names.subject_prefix
    publisher = _publisher(nc, names)
    fits = payload_room(nc.max_payload) - len(b"big") - len(b"X-A: 1\r\n")
    assert fits == nc.max_payload - len(b"NATS/1.0\r\nNats-Msg-Id: \r\n\r\n") - len(b"big") - len(b"X-A: 1\r\n")
    runtime.run(publisher.publish([message(prefix, "t", "insert", b"x" * fits, "big",
                                           subject=f"{prefix}.tenants.a".encode(), headers=b"X-A: 1\r\n")]))
    runtime.run(publisher.settle())  # exactly max_payload, headers included: stored
    over = message(prefix, "t", "insert", b"x" * fits, "big", subject=f"{prefix}.tenants.a".encode(),
                   headers=b"X-A: 12\r\n")
    with pytest.raises(PermanentPublishError, match=rf"^JetStream refused {prefix}\.tenants\.a \(Nats-Msg-Id big\): the "
                                                    rf"message is larger than the server's max_payload \({nc.max_payload + 1} "
                                                    rf"> {nc.max_payload} bytes with its headers\)"):
        runtime.run(publisher.publish([over]))
    assert nc.is_connected and not nc.is_closed  # refused before sending


def _sink(nats_srv: Nats, names: TestNames, name: str = "orders", **keys: Any) -> SinkConfig:
    destination = _destination(nats_srv, names, **keys.pop("destination", {}))
    return SinkConfig.model_validate({"name": name, "database": "app", "destination": destination, **keys})


def test_the_replay_scan_finds_this_sinks_routed_messages_and_ignores_other_sinks(
    nc: WalflowClient, nats_srv: Nats, names: TestNames
) -> None:
    prefix = names.subject_prefix
    ours, other_sink, other_db = IdScheme("app", "orders"), IdScheme("app", "audit"), IdScheme("crm", "orders")
    read = ours.encode_read("bf1", '["9"]').decode()
    stored = [
        (f"{prefix}.tenants.a", ours.encode(10, 0).decode()),  # below the confirmed LSN
        (f"{prefix}.app.public.t.insert", ours.encode(20, 0).decode()),
        (f"{prefix}.tenants.b", ours.encode(30, 1).decode()),
        (f"{prefix}.tenants.a", other_sink.encode(40, 0).decode()),  # another sink's, same subjects, above it
        (f"{prefix}.tenants.b", other_db.encode(50, 0).decode()),  # another database's
        (f"{prefix}.tenants.b", read),  # a backfill's read of this sink, routed
        (f"{prefix}.tenants.c", other_sink.encode(5, 0).decode()),  # the tail: not ours, so no boundary
    ]

    async def fill() -> None:
        js = nc.jetstream()
        for subject, msg_id in stored:
            await js.publish(subject, b"{}", headers={"Nats-Msg-Id": msg_id})

    runtime.run(fill())
    routed = _sink(nats_srv, names, routing={"python": "shaping:route"})
    target = SinkTarget.prepare(routed, "app", runtime, replay_from=20, scanned=replay_subjects(routed, "app"))
    try:
        assert target.horizon == 30  # the replay horizon: the highest position found
        assert target.skip == frozenset({ours.encode(20, 0).decode(), ours.encode(30, 1).decode(), read})
        assert target.stream.subjects == (f"{prefix}.app.>", f"{prefix}.tenants.>")
        part = JetStreamSink(target).build_part("publish", "orders-0", None)
        stored_since = part._publisher._stored_since

        async def since_start() -> set[str]:
            assert stored_since is not None
            return await stored_since(1)

        # a late re-send's check reads the routed subjects too
        assert {ours.encode(10, 0).decode(), ours.encode(30, 1).decode()} <= runtime.run(since_start())
        part.close()
    finally:
        target.close()
    unrouted = _sink(nats_srv, names)
    target = SinkTarget.prepare(unrouted, "app", runtime, replay_from=20, scanned=replay_subjects(unrouted, "app"))
    try:
        assert target.skip == frozenset({ours.encode(20, 0).decode()})  # what a scan of <prefix>.app.> alone sees
    finally:
        target.close()


def test_a_routed_message_sent_again_keeps_its_subject_and_headers(
    dest: NatsDestination, names: TestNames
) -> None:
    """No stream yet: JetStream answers 503 until one captures the subjects, and the re-sends
    go out as the messages were first sent."""
    prefix = names.subject_prefix
    client = runtime.run(connect(dest, name="walflow-test"))
    try:
        publisher = _publisher(client, names)
        messages = [
            message(prefix, "t", "insert", b"{}", "r-1", subject=f"{prefix}.tenants.a".encode(), headers=b"X-A: 1\r\n"),
            message(prefix, "t", "insert", b"{}", "r-2"),
        ]
        done = threading.Event()

        def publish() -> None:
            runtime.run(publisher.publish(messages))
            runtime.run(publisher.settle())
            done.set()

        worker = threading.Thread(target=publish)
        worker.start()
        assert not done.wait(1.0)  # refused ("no responders") and retried
        runtime.run(ensure_stream(client, dest, "app"))
        worker.join(60)
        assert done.is_set()
        assert runtime.run(_stored(client, names.stream)) == [
            (f"{prefix}.tenants.a", b"{}", b"NATS/1.0\r\nNats-Msg-Id: r-1\r\nX-A: 1\r\n\r\n"),
            (f"{prefix}.app.public.t.insert", b"{}", b"NATS/1.0\r\nNats-Msg-Id: r-2\r\n\r\n"),
        ]
    finally:
        runtime.run(client.close())
