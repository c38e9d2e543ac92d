"""Atomic batches against a real nats-server (2.12 or later): whole units, in order, once.

:class:`~connectors.nats.atomic.AtomicPublisher` publishes what render hands it, units ended
by :data:`~core.events.TRANSACTION_END`; a reader polling the stream while whole transactions
are published is ``tests/dataflows/test_atomic_transactions.py``'s.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from nats.aio.client import ServerVersion

from config.schema import NatsDestination
from connectors.nats.atomic import MAX_MSGS, AtomicPublisher
from connectors.nats.connection import connect
from connectors.nats.natspy import WalflowClient
from connectors.nats.replay import ids_since
from connectors.nats.stream import OWN_DESCRIPTION, ensure_stream
from core.errors import StreamSetupError
from core.events import TRANSACTION_END
from core.message import Message
from core.runtime import Runtime
from tests.connectors.nats.clients import message
from tests.harness import Nats, TestNames

runtime = Runtime()


@pytest.fixture
def dest(nats_srv: Nats, names: TestNames, stream_cleanup: str) -> NatsDestination:
    return NatsDestination.model_validate({
        "type": "nats", **nats_srv.destination, "subject_prefix": names.subject_prefix,
        "stream": {"name": names.stream}, "ack_timeout_ms": 2000})


@pytest.fixture
def nc(dest: NatsDestination) -> Iterator[WalflowClient]:
    client = runtime.run(connect(dest, name="walflow-test"))
    try:
        runtime.run(ensure_stream(client, dest, "app", atomic=True))
        yield client
    finally:
        runtime.run(client.close())


def _publisher(nc: WalflowClient, names: TestNames) -> AtomicPublisher:
    async def stored_since(seq: int) -> set[str]:
        return await ids_since(nc, names.stream, f"{names.subject_prefix}.app.>", seq)

    publisher = AtomicPublisher(nc, window=64, ack_timeout=2.0, label="test", stored_since=stored_since)
    runtime.run(publisher.start())
    return publisher


def _unit(prefix: str, ids: range) -> list[Message]:
    return [*(message(prefix, "t", "insert", b'{"i": %d}' % i, f"id-{i}") for i in ids), TRANSACTION_END]


async def _stored(nc: WalflowClient, stream: str) -> list[tuple[str, dict[str, str]]]:
    """Each stored message's id and its headers but the id."""
    js = nc.jetstream()
    info = await js.stream_info(stream)
    out = []
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        headers = dict((await js.get_msg(stream, seq)).headers or {})
        out.append((headers.pop("Nats-Msg-Id", ""), {k: v for k, v in headers.items() if k.startswith("Walflow")}))
    return out


def test_walflow_lets_the_stream_take_atomic_batches(nc: WalflowClient, names: TestNames) -> None:
    reply = runtime.run(nc.request(f"$JS.API.STREAM.INFO.{names.stream}", b""))
    assert json.loads(reply.data)["config"]["allow_atomic"] is True  # nats-py's StreamConfig has no field for it


def test_units_are_stored_whole_in_order_and_the_open_one_waits_for_its_end(nc: WalflowClient,
                                                                            names: TestNames) -> None:
    prefix, publisher = names.subject_prefix, _publisher(nc, names)
    runtime.run(publisher.publish([*_unit(prefix, range(1)), *_unit(prefix, range(1, 4)),
                                   *_unit(prefix, range(4, 7))[:-1]]))  # the last unit is still open
    runtime.run(publisher.settle())
    assert [msg_id for msg_id, _ in runtime.run(_stored(nc, names.stream))] == [f"id-{i}" for i in range(4)]
    runtime.run(publisher.publish([*_unit(prefix, range(7, 9)), TRANSACTION_END]))  # ends it, then one more
    runtime.run(publisher.settle())
    stored = runtime.run(_stored(nc, names.stream))
    assert stored == [(f"id-{i}", {}) for i in range(9)]  # whole units fit one batch: nothing marks them
    assert publisher.last_seq == 9


def test_a_unit_larger_than_a_batch_goes_as_consecutive_marked_batches(nc: WalflowClient, names: TestNames) -> None:
    publisher = _publisher(nc, names)
    n = 2 * MAX_MSGS + 500
    runtime.run(publisher.publish(_unit(names.subject_prefix, range(n))))
    runtime.run(publisher.settle())
    stored = runtime.run(_stored(nc, names.stream))
    assert [msg_id for msg_id, _ in stored] == [f"id-{i}" for i in range(n)]
    marks = [headers for _, headers in stored]
    assert marks[0] == marks[MAX_MSGS - 1] == {"Walflow-Transaction-Batch": "1"}
    assert marks[MAX_MSGS] == marks[2 * MAX_MSGS - 1] == {"Walflow-Transaction-Batch": "2"}
    assert marks[2 * MAX_MSGS] == marks[-1] == {"Walflow-Transaction-Batch": "3", "Walflow-Transaction-Batches": "3"}


def test_a_unit_exactly_a_batch_long_is_one_unmarked_batch(nc: WalflowClient, names: TestNames) -> None:
    publisher = _publisher(nc, names)
    runtime.run(publisher.publish(_unit(names.subject_prefix, range(MAX_MSGS))))
    runtime.run(publisher.settle())
    assert {tuple(headers) for _, headers in runtime.run(_stored(nc, names.stream))} == {()}


def test_a_batch_holding_stored_ids_sends_only_what_the_stream_lacks(nc: WalflowClient, names: TestNames) -> None:
    # JetStream refuses a batch with an id it holds whole (10201): a replay must leave those out
    prefix = names.subject_prefix
    first = _publisher(nc, names)
    runtime.run(first.publish(_unit(prefix, range(3))))
    again = _publisher(nc, names)  # e.g. after a crash: it does not know what the stream holds
    runtime.run(again.publish(_unit(prefix, range(1, 6))))
    runtime.run(again.settle())
    assert [msg_id for msg_id, _ in runtime.run(_stored(nc, names.stream))] == [f"id-{i}" for i in range(6)]
    assert again._metrics.publish_retries.labels("", "atomic_batch")._value.get() == 1  # refused once, then sent


def test_a_stream_that_persists_asynchronously_is_refused_clearly(nc: WalflowClient, dest: NatsDestination,
                                                                 names: TestNames) -> None:
    runtime.run(nc.jetstream().delete_stream(names.stream))
    body = b'{"name": "%s", "subjects": ["%s.app.>"], "persist_mode": "async", "description": "%s"}' % (
        names.stream.encode(), names.subject_prefix.encode(), OWN_DESCRIPTION.encode())
    runtime.run(nc.request(f"$JS.API.STREAM.CREATE.{names.stream}", body))
    with pytest.raises(StreamSetupError, match="persist_mode: async cannot: set its persist_mode to default"):
        runtime.run(ensure_stream(nc, dest, "app", atomic=True))


def test_a_stream_walflow_did_not_create_is_left_alone_with_what_to_do(nc: WalflowClient, dest: NatsDestination,
                                                                      names: TestNames) -> None:
    runtime.run(nc.jetstream().delete_stream(names.stream))
    runtime.run(nc.jetstream().add_stream(name=names.stream, subjects=[f"{names.subject_prefix}.app.>"]))
    with pytest.raises(StreamSetupError, match="walflow did not create it.*set allow_atomic: true in its configuration"):
        runtime.run(ensure_stream(nc, dest, "app", atomic=True))


def test_a_server_older_than_2_12_is_refused_clearly(nc: WalflowClient, dest: NatsDestination,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(type(nc), "connected_server_version", property(lambda _: ServerVersion("2.11.9")))
    with pytest.raises(StreamSetupError, match=r"needs nats-server 2\.12 or later .* is 2\.11\.9"):
        runtime.run(ensure_stream(nc, dest, "app", atomic=True))
