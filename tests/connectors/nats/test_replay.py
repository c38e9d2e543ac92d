"""The replay scan (connectors/nats/replay.py) against a real NATS: which ids are already stored."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from connectors.nats.natspy import WalflowClient
from connectors.nats.replay import _boundary, already_published, horizon, ids_since
from core.ids import IdScheme
from core.runtime import Runtime
from tests.connectors.nats.clients import nats_client
from tests.harness import Nats, TestNames

runtime = Runtime()
OURS = IdScheme("app", "s1")
OTHER_SINK = IdScheme("app", "s2")
OTHER_DB = IdScheme("crm", "s1")


@pytest.fixture
def nc(nats_srv: Nats, stream_cleanup: str) -> Iterator[WalflowClient]:
    with nats_client(runtime, nats_srv, "walflow-replay-test") as client:
        yield client


def _id(ids: IdScheme, lsn: int, idx: int = 0) -> str:
    return ids.encode(lsn, idx).decode("ascii")


def _stream(nc: WalflowClient, names: TestNames, messages: list[tuple[str, str]]) -> None:
    """Create the test's stream on ``<prefix>.>`` and store ``(subject, msg id)`` messages in order."""

    async def fill() -> None:
        js = nc.jetstream()
        await js.add_stream(name=names.stream, subjects=[f"{names.subject_prefix}.>"])
        for subject, msg_id in messages:
            await js.publish(f"{names.subject_prefix}.{subject}", b"{}", headers={"Nats-Msg-Id": msg_id})

    runtime.run(fill())


def _ours(names: TestNames) -> str:
    return f"{names.subject_prefix}.app.>"


def test_an_empty_or_missing_stream_holds_nothing(nc: WalflowClient, names: TestNames) -> None:
    assert runtime.run(already_published(nc, names.stream, _ours(names), OURS, 100)) == set()  # no stream yet
    _stream(nc, names, [])
    assert runtime.run(already_published(nc, names.stream, _ours(names), OURS, 100)) == set()
    assert runtime.run(ids_since(nc, names.stream, _ours(names), 1)) == set()


def test_the_ids_at_and_after_since_lsn_are_found_with_many_below(nc: WalflowClient, names: TestNames) -> None:
    below = [("app.public.t.insert", _id(OURS, lsn)) for lsn in range(1, 300)]
    above = [("app.public.t.insert", _id(OURS, lsn, idx)) for lsn in range(300, 310) for idx in range(2)]
    _stream(nc, names, below + above)
    found = runtime.run(already_published(nc, names.stream, _ours(names), OURS, 300))
    assert found == {msg_id for _, msg_id in above}
    # the boundary lies below since_lsn, but not at the stream's start: the tail scan stays short
    boundary = runtime.run(_boundary(nc, names.stream, _ours(names), 1, len(below) + len(above), OURS, 300))
    assert 1 < boundary <= len(below)


def test_since_lsn_zero_finds_nothing_to_skip(nc: WalflowClient, names: TestNames) -> None:
    _stream(nc, names, [("app.public.t.insert", _id(OURS, 5))])
    assert runtime.run(already_published(nc, names.stream, _ours(names), OURS, 0)) == set()


def test_when_every_message_is_at_or_above_since_lsn_all_are_found(nc: WalflowClient, names: TestNames) -> None:
    messages = [("app.public.t.update", _id(OURS, lsn)) for lsn in (500, 501, 502)]
    _stream(nc, names, messages)
    found = runtime.run(already_published(nc, names.stream, _ours(names), OURS, 500))
    assert found == {msg_id for _, msg_id in messages}


def test_other_sinks_and_databases_in_the_same_stream_are_ignored(nc: WalflowClient, names: TestNames) -> None:
    messages = [
        ("app.public.t.insert", _id(OURS, 10)),
        ("app.public.t.insert", _id(OURS, 20)),
        ("app.public.t.insert", _id(OTHER_SINK, 900)),  # another sink of this database, above since_lsn
        ("crm.public.t.insert", _id(OTHER_DB, 900)),  # another database's (its own subjects)
        ("app.public.t.insert", "not-base64!"),  # no id of walflow's at all
        ("app.public.t.insert", _id(OURS, 30)),
        ("app.public.t.insert", _id(OTHER_SINK, 1)),  # below since_lsn, but not ours: no boundary
    ]
    _stream(nc, names, messages)
    found = runtime.run(already_published(nc, names.stream, _ours(names), OURS, 20))
    assert found == {_id(OURS, 20), _id(OURS, 30)}


def test_ids_since_reads_from_a_sequence_on_the_given_subjects(nc: WalflowClient, names: TestNames) -> None:
    messages = [
        ("app.public.t.insert", "a"),
        ("crm.public.t.insert", "b"),
        ("app.public.t.delete", "c"),
        ("app.sales.u.update", "d"),
        ("crm.public.t.insert", "e"),  # the stream's last message is not on our subjects
    ]
    _stream(nc, names, messages)
    assert runtime.run(ids_since(nc, names.stream, _ours(names), 1)) == {"a", "c", "d"}
    assert runtime.run(ids_since(nc, names.stream, _ours(names), 3)) == {"c", "d"}
    assert runtime.run(ids_since(nc, names.stream, _ours(names), 5)) == set()  # past our last message
    assert runtime.run(ids_since(nc, names.stream, f"{names.subject_prefix}.crm.>", 2)) == {"b", "e"}


def test_horizon_is_the_highest_lsn_of_this_pipelines_ids() -> None:
    assert horizon(set(), OURS) == 0
    ids = {_id(OURS, 7, 3), _id(OURS, 12), _id(OTHER_SINK, 99), _id(OTHER_DB, 99), "garbage", ""}
    assert horizon(ids, OURS) == 12
    assert horizon(frozenset(ids), OTHER_SINK) == 99


SEQUIN = IdScheme("app", "s1", msg_id="sequin")


def test_sequin_form_ids_are_told_apart_by_their_subjects(nc: WalflowClient, names: TestNames) -> None:
    """Sequin's ids name no database: another database's messages in a shared stream carry
    ids that decode as positions too, and only their subjects say they are not ours —
    also at the tail, where the boundary probe starts."""
    theirs = IdScheme("crm", "s9", msg_id="sequin")
    messages = [
        ("app.public.t.insert", _id(SEQUIN, 10)),
        ("crm.public.t.insert", _id(theirs, 25)),  # another database's, at and above since_lsn
        ("app.public.t.insert", _id(SEQUIN, 20)),
        ("app.public.t.insert", _id(OURS, 40)),  # walflow's form, even of this sink's name: not this form
        ("app.public.t.read", SEQUIN.encode_read("bf", "[1]").decode()),  # a read of this sink
        ("app.public.t.insert", _id(SEQUIN, 30, 2)),
        *[("crm.public.t.insert", _id(theirs, 1, idx)) for idx in range(5)],  # the tail: below since_lsn, not ours
    ]
    _stream(nc, names, messages)
    found = runtime.run(already_published(nc, names.stream, _ours(names), SEQUIN, 20))
    assert found == {_id(SEQUIN, 20), _id(SEQUIN, 30, 2), SEQUIN.encode_read("bf", "[1]").decode()}
    assert horizon(found, SEQUIN) == 30
    # the other database's tail (its lsn 1 < 20) does not end the probe there: it goes back
    # until this sink's messages are older (here: the stream's start)
    assert runtime.run(_boundary(nc, names.stream, _ours(names), 1, len(messages), SEQUIN, 20)) == 1
