"""The JetStream side against a real NATS: acks in flight, order, outages, the stream check."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from config.schema import NatsDestination
from connectors.nats.connection import connect
from connectors.nats.natspy import WalflowClient
from connectors.nats.publisher import AckPublisher
from connectors.nats.replay import ids_since
from connectors.nats.stream import ensure_stream
from connectors.nats.window import InFlight
from core.errors import FatalError, PermanentPublishError, StreamSetupError
from core.message import Message
from core.runtime import Runtime
from embedded import wait_for
from tests.connectors.nats.clients import message
from tests.harness import Nats, TestNames

runtime = Runtime()


def _dest(nats_srv: Nats, names: TestNames, **stream: object) -> NatsDestination:
    return NatsDestination.model_validate(
        {
            "type": "nats",
            **nats_srv.destination,
            "subject_prefix": names.subject_prefix,
            "stream": {"name": names.stream, "duplicate_window_ms": 60_000, **stream},
            "ack_timeout_ms": 2000,
        }
    )


@pytest.fixture
def dest(nats_srv: Nats, names: TestNames, stream_cleanup: str) -> NatsDestination:
    return _dest(nats_srv, names)


@pytest.fixture
def nc(dest: NatsDestination) -> Iterator[WalflowClient]:
    client = runtime.run(connect(dest, name="walflow-test"))
    try:
        yield client
    finally:
        runtime.run(client.close())


def _messages(prefix: str, n: int, start: int = 0) -> list[Message]:
    """Messages on ``<prefix>.app.public.t.insert``."""
    return [message(prefix, "t", "insert", f'{{"i": {i}}}'.encode(), f"id-{i}") for i in range(start, n)]


async def _stored(nc: WalflowClient, stream: str) -> list[tuple[bytes, str]]:
    js = nc.jetstream()
    info = await js.stream_info(stream)
    out = []
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        msg = await js.get_msg(stream, seq)
        out.append((msg.data or b"", (msg.headers or {}).get("Nats-Msg-Id", "")))
    return out


def test_missing_stream_is_created_from_the_config(nc: WalflowClient, dest: NatsDestination, names: TestNames) -> None:
    found = runtime.run(ensure_stream(nc, dest, "app"))
    assert (found.name, found.duplicate_window) == (names.stream, 60)
    info = runtime.run(nc.jetstream().stream_info(names.stream))
    assert info.config.subjects == [f"{names.subject_prefix}.app.>"]  # this database's subjects, not the prefix's
    assert info.config.duplicate_window == 60
    runtime.run(ensure_stream(nc, dest, "app"))  # present and fine: no error, no change


def test_stream_with_other_subjects_is_a_clear_error(nc: WalflowClient, dest: NatsDestination, names: TestNames) -> None:
    runtime.run(nc.jetstream().add_stream(name=names.stream, subjects=[f"{names.subject_prefix}.other.>"]))
    with pytest.raises(StreamSetupError) as info:
        runtime.run(ensure_stream(nc, dest, "app"))
    assert str(info.value).startswith(
        f"JetStream stream '{names.stream}' captures ['{names.subject_prefix}.other.>'], not walflow's subjects "
        f"'{names.subject_prefix}.app.>' for database 'app'"
    )


def test_missing_stream_without_create_is_a_clear_error(nats_srv: Nats, names: TestNames, nc: WalflowClient) -> None:
    dest = _dest(nats_srv, names, create_if_not_exists=False)
    with pytest.raises(StreamSetupError, match=f"JetStream stream '{names.stream}' does not exist"):
        runtime.run(ensure_stream(nc, dest, "app"))


def _publisher(nc: WalflowClient, window: int = 64) -> AckPublisher:
    publisher = AckPublisher(nc, window=window, ack_timeout=2.0, label="test")
    runtime.run(publisher.start())
    return publisher


def test_many_in_flight_all_stored_in_order_once(nc: WalflowClient, dest: NatsDestination, names: TestNames) -> None:
    runtime.run(ensure_stream(nc, dest, "app"))
    publisher = _publisher(nc)
    messages = _messages(names.subject_prefix, 3000)
    runtime.run(publisher.publish(messages[:2000]))
    runtime.run(publisher.publish(messages[2000:]))
    runtime.run(publisher.settle())
    assert publisher.last_seq == 3000
    runtime.run(publisher.publish(messages[:10]))  # a replay: JetStream drops the duplicates
    runtime.run(publisher.settle())
    stored = runtime.run(_stored(nc, names.stream))
    assert stored == [(m.payload, m.msg_id) for m in messages]


def test_outage_blocks_then_everything_lands_in_order(
    nc: WalflowClient, dest: NatsDestination, names: TestNames, nats_srv: Nats
) -> None:
    runtime.run(ensure_stream(nc, dest, "app"))
    publisher = _publisher(nc, window=50)
    messages = _messages(names.subject_prefix, 400)
    runtime.run(publisher.publish(messages[:100]))
    runtime.run(publisher.settle())
    nats_srv.stop()
    done = threading.Event()

    def publish_rest() -> None:
        runtime.run(publisher.publish(messages[100:]))
        runtime.run(publisher.settle())
        done.set()

    worker = threading.Thread(target=publish_rest)
    worker.start()
    assert not done.wait(2.0)  # no NATS: the sink waits, it does not drop or skip
    nats_srv.start()
    worker.join(60)
    assert done.is_set()
    wait_for(lambda: nc.is_connected, timeout=30, what="reconnect")
    stored = runtime.run(_stored(nc, names.stream))
    assert stored == [(m.payload, m.msg_id) for m in messages]


def test_message_over_max_payload_stops_with_a_clear_error(nc: WalflowClient, dest: NatsDestination, names: TestNames) -> None:
    """The invariant behind the size policy, not the policy: render fits every message to the
    server's max_payload (``tests/transforms/test_render.py``, ``tests/dataflows/test_sizes.py``);
    one that came past it (the server's limit fell since) must still never reach the server."""
    runtime.run(ensure_stream(nc, dest, "app"))
    publisher = _publisher(nc)
    too_big = message(names.subject_prefix, "t", "insert", b"x" * (nc.max_payload + 1), "big")
    with pytest.raises(PermanentPublishError, match="larger than the server's max_payload") as info:
        runtime.run(publisher.publish([too_big]))
    assert isinstance(info.value, FatalError)  # stops the pipeline with one line
    assert f"{names.subject_prefix}.app.public.t.insert (Nats-Msg-Id big)" in str(info.value)


def test_message_over_max_payload_only_with_its_headers_stops_with_a_clear_error(
    nc: WalflowClient, dest: NatsDestination, names: TestNames
) -> None:
    """The server counts headers against max_payload too (and drops the connection over it):
    a payload a few bytes under the limit must be refused by name, not hang the sink (render
    counts them the same way: ``connectors.nats.publisher.payload_room``)."""
    runtime.run(ensure_stream(nc, dest, "app"))
    publisher = _publisher(nc)
    almost = message(names.subject_prefix, "t", "insert", b"x" * (nc.max_payload - 10), "almost")
    with pytest.raises(PermanentPublishError, match="larger than the server's max_payload"):
        runtime.run(publisher.publish([almost]))
    assert nc.is_connected and not nc.is_closed  # refused before sending: the server never saw it


def test_a_stream_named_error_is_not_mistaken_for_an_error(nats_srv: Nats, names: TestNames) -> None:
    dest = _dest(nats_srv, names).model_copy(
        update={"stream": _dest(nats_srv, names).stream.model_copy(update={"name": "error"})}
    )
    client = runtime.run(connect(dest, name="walflow-test"))
    try:
        runtime.run(ensure_stream(client, dest, "app"))
        publisher = _publisher(client)
        messages = _messages(names.subject_prefix, 5)
        runtime.run(publisher.publish(messages))
        runtime.run(publisher.settle())
        assert publisher.last_seq == 5
    finally:
        runtime.run(client.jetstream().delete_stream("error"))
        runtime.run(client.close())


def test_unreachable_nats_is_retried_until_it_comes_up(nats_srv: Nats, names: TestNames, stream_cleanup: str) -> None:
    dest = _dest(nats_srv, names)
    nats_srv.stop()
    result: list[WalflowClient] = []
    worker = threading.Thread(target=lambda: result.append(runtime.run(connect(dest, name="late"))))
    worker.start()
    worker.join(2.0)
    assert not result  # still trying
    nats_srv.start()
    worker.join(60)
    assert result and result[0].is_connected
    runtime.run(result[0].close())



def test_a_reconnect_never_puts_a_later_change_ahead(
    nc: WalflowClient, dest: NatsDestination, names: TestNames, nats_srv: Nats
) -> None:
    """A send that fails during an outage is settled before anything newer goes out."""
    runtime.run(ensure_stream(nc, dest, "app"))
    publisher = _publisher(nc)
    first, second = _messages(names.subject_prefix, 2)
    nats_srv.stop()
    wait_for(lambda: not nc.is_connected, timeout=10, what="the client to notice")
    worker = threading.Thread(target=lambda: runtime.run(publisher.publish([first])))
    worker.start()  # write_batch during the outage: waits, in order
    nats_srv.start()
    worker.join(60)
    assert not worker.is_alive()
    runtime.run(publisher.publish([second]))
    runtime.run(publisher.settle())
    assert runtime.run(_stored(nc, names.stream)) == [(first.payload, first.msg_id), (second.payload, second.msg_id)]


def test_a_resend_past_the_duplicate_window_asks_the_stream_first(
    nc: WalflowClient, dest: NatsDestination, names: TestNames
) -> None:
    """An ack lost, NATS away longer than the duplicate window: the message is in the stream,
    JetStream would no longer recognise its id, so walflow checks before sending it again."""
    runtime.run(ensure_stream(nc, dest, "app"))
    subjects = f"{names.subject_prefix}.app.>"
    publisher = AckPublisher(
        nc, window=64, ack_timeout=2.0, label="test", duplicate_window=1.0,
        stored_since=lambda seq: ids_since(nc, names.stream, subjects, seq),
    )
    runtime.run(publisher.start())
    stored_one, lost_one = _messages(names.subject_prefix, 2)
    runtime.run(publisher.publish([stored_one]))
    runtime.run(publisher.settle())

    # as settle() sees messages whose acks never came
    entries = [InFlight(m, first_sent=time.monotonic() - 60, floor_seq=0) for m in (stored_one, lost_one)]
    kept = runtime.run(publisher._drop_stored(entries))
    assert [e.message.msg_id for e in kept] == [lost_one.msg_id]
