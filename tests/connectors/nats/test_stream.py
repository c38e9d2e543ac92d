"""Which stream a sink's events land in (connectors/nats/stream.py), against a real NATS.

A stream that captures the sink's subjects is used whatever its name; one that captures
only part of them, or an explicit name beside a capturing stream, is a clear error;
otherwise the configured stream is created on ``<prefix>.<database>.>``, and a stream
walflow created takes a second database's subjects. Also the check that Sequin-form ids
(``msg_id: sequin``) do not share a stream (connectors/nats/clashes.py), through a sink's target.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from nats.js.errors import NotFoundError

from config.schema import NatsDestination, SinkConfig
from connectors.nats.clashes import SharedSequinIdsError
from connectors.nats.connection import connect
from connectors.nats.natspy import WalflowClient
from connectors.nats.sink import JetStreamSink
from connectors.nats.stream import OWN_DESCRIPTION, ensure_stream, stream_for
from connectors.nats.target import SinkTarget
from core.errors import StreamSetupError
from core.runtime import Runtime
from core.subjects import database_subjects
from tests.connectors.nats.clients import message, nats_client
from tests.harness import Nats, TestNames, delete_stream

runtime = Runtime()


@pytest.fixture
def nc(nats_srv: Nats, stream_cleanup: str) -> Iterator[WalflowClient]:
    with nats_client(runtime, nats_srv, "walflow-stream-test") as client:
        yield client


@pytest.fixture
def target_connections(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[WalflowClient]]:
    """Every connection a sink's target opens in the test, closed at its end should the test have
    left one open (a refused start that did not close its own would reconnect to the session's
    NATS, through its restarts, for the rest of the session)."""
    opened: list[WalflowClient] = []

    async def connecting(*args: Any, **kwargs: Any) -> WalflowClient:
        client = await connect(*args, **kwargs)
        opened.append(client)
        return client

    monkeypatch.setattr("connectors.nats.target.connect", connecting)
    yield opened
    for client in opened:
        if not client.is_closed:
            runtime.run(client.close())


@pytest.fixture
def default_stream(nats_srv: Nats) -> Iterator[str]:
    """``WALFLOW``, the default name: removed afterwards should a test have created it."""
    yield "WALFLOW"
    delete_stream(nats_srv.url, "WALFLOW")


def _destination(nats_srv: Nats, names: TestNames, **keys: Any) -> dict[str, Any]:
    return {"type": "nats", **nats_srv.destination, "subject_prefix": names.subject_prefix, **keys}


def _dest(nats_srv: Nats, names: TestNames, **keys: Any) -> NatsDestination:
    return NatsDestination.model_validate(_destination(nats_srv, names, **keys))


def _add(nc: WalflowClient, name: str, subjects: list[str], **config: Any) -> None:
    runtime.run(nc.jetstream().add_stream(name=name, subjects=subjects, **config))


def _subjects(nc: WalflowClient, name: str) -> list[str]:
    return list(runtime.run(nc.jetstream().stream_info(name)).config.subjects or [])


def _exists(nc: WalflowClient, name: str) -> bool:
    try:
        runtime.run(nc.jetstream().stream_info(name))
    except NotFoundError:
        return False
    return True


def test_a_stream_that_captures_the_subjects_is_used_whatever_its_name(
    nc: WalflowClient, nats_srv: Nats, names: TestNames, default_stream: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A Sequin user's stream on ``<prefix>.>``, and no stream name in the config: used as it is."""
    _add(nc, names.stream, [f"{names.subject_prefix}.>"], duplicate_window=30)
    dest = _dest(nats_srv, names)  # no destination.stream: the default name, not given
    with caplog.at_level(logging.INFO, logger="walflow.nats"):
        found = runtime.run(ensure_stream(nc, dest, "app"))
    assert (found.name, found.duplicate_window) == (names.stream, 30)
    assert not _exists(nc, default_stream)
    assert _subjects(nc, names.stream) == [f"{names.subject_prefix}.>"]  # untouched
    lines = [r.getMessage() for r in caplog.records if "using JetStream stream" in r.getMessage()]
    assert lines == [f"using JetStream stream '{names.stream}' as it is: it captures this database's subjects "
                     f"{names.subject_prefix}.app.> (its subjects: {names.subject_prefix}.>, duplicate window 30 s)"]
    assert runtime.run(stream_for(nc, dest, "app")) == names.stream


def test_streams_that_capture_the_subjects_only_together_are_used(
    nc: WalflowClient, nats_srv: Nats, names: TestNames, default_stream: str
) -> None:
    prefix = names.subject_prefix
    _add(nc, names.stream, [f"{prefix}.app.*.*.{action}" for action in ("insert", "update", "delete", "read")])
    assert runtime.run(ensure_stream(nc, _dest(nats_srv, names), "app")).name == names.stream
    assert not _exists(nc, default_stream)


def test_a_stream_that_captures_part_of_the_subjects_is_a_clear_error(
    nc: WalflowClient, nats_srv: Nats, names: TestNames, default_stream: str
) -> None:
    prefix = names.subject_prefix
    _add(nc, names.stream, [f"{prefix}.app.public.orders.*"])
    with pytest.raises(StreamSetupError) as info:
        runtime.run(ensure_stream(nc, _dest(nats_srv, names), "app"))
    assert str(info.value) == (
        f"JetStream streams capture only part of walflow's subjects '{prefix}.app.>' for database 'app' "
        f"('{names.stream}' captures ['{prefix}.app.public.orders.*']; nothing captures e.g. "
        f"'{prefix}.app.*.*.insert'), and JetStream stores a subject in one stream only: walflow can neither publish "
        f"all its events there nor create stream 'WALFLOW' beside them. Make one stream capture '{prefix}.app.>' "
        f"(e.g. '{prefix}.>'), or change subject_prefix"
    )
    assert not _exists(nc, default_stream)


def test_an_explicit_stream_name_beside_a_capturing_stream_is_an_error(
    nc: WalflowClient, nats_srv: Nats, names: TestNames, default_stream: str
) -> None:
    prefix = names.subject_prefix
    _add(nc, names.stream, [f"{prefix}.>"])
    for explicit in ("WALFLOW", "Mine"):  # the default name too, when the config writes it
        with pytest.raises(StreamSetupError) as info:
            runtime.run(ensure_stream(nc, _dest(nats_srv, names, stream={"name": explicit}), "app"))
        assert str(info.value) == (
            f"destination.stream.name is '{explicit}', but JetStream stream '{names.stream}' already captures "
            f"walflow's subjects '{prefix}.app.>' for database 'app' (its subjects: ['{prefix}.>']), and JetStream "
            f"stores a subject in one stream only: set destination.stream.name to '{names.stream}' or remove it, "
            "or change subject_prefix"
        )
    assert not _exists(nc, default_stream)
    same = _dest(nats_srv, names, stream={"name": names.stream})
    assert runtime.run(ensure_stream(nc, same, "app")).name == names.stream


def test_the_created_stream_captures_this_databases_subjects(nc: WalflowClient, nats_srv: Nats, names: TestNames) -> None:
    prefix = names.subject_prefix
    dest = _dest(nats_srv, names, stream={"name": names.stream, "max_msgs": 1000})
    assert runtime.run(stream_for(nc, dest, "app")) == names.stream  # where it would be: nothing created
    assert not _exists(nc, names.stream)
    assert runtime.run(ensure_stream(nc, dest, "app")).name == names.stream
    info = runtime.run(nc.jetstream().stream_info(names.stream))
    assert (info.config.subjects, info.config.description, info.config.max_msgs) == (
        [f"{prefix}.app.>"], OWN_DESCRIPTION, 1000)
    # another stream on the prefix's other subjects can live beside it
    _add(nc, f"{names.stream}_other", [f"{prefix}.billing.>"])
    try:
        assert runtime.run(ensure_stream(nc, dest, "app")).name == names.stream
    finally:
        runtime.run(nc.jetstream().delete_stream(f"{names.stream}_other"))


def test_configured_subjects_that_do_not_capture_the_sinks_create_nothing(
    nc: WalflowClient, nats_srv: Nats, names: TestNames
) -> None:
    prefix = names.subject_prefix
    dest = _dest(nats_srv, names, stream={"name": names.stream, "subjects": [f"{prefix}.app.public.>"]})
    with pytest.raises(StreamSetupError, match=r"destination.stream.subjects .* do not capture walflow's subjects"):
        runtime.run(ensure_stream(nc, dest, "app"))
    assert not _exists(nc, names.stream)
    wide = _dest(nats_srv, names, stream={"name": names.stream, "subjects": [f"{prefix}.>"]})
    runtime.run(ensure_stream(nc, wide, "app"))
    assert _subjects(nc, names.stream) == [f"{prefix}.>"]


def test_two_databases_share_a_stream_walflow_created(nc: WalflowClient, nats_srv: Nats, names: TestNames) -> None:
    """Two databases of one config, one stream name: the second one's subjects are added to
    the stream the first one created, its other settings kept."""
    prefix = names.subject_prefix
    dest = _dest(nats_srv, names, stream={"name": names.stream, "duplicate_window_ms": 45_000})
    runtime.run(ensure_stream(nc, dest, "app"))
    runtime.run(ensure_stream(nc, dest, "crm"))
    assert runtime.run(ensure_stream(nc, dest, "app")).name == names.stream  # both captured now: no change
    info = runtime.run(nc.jetstream().stream_info(names.stream))
    assert (info.config.subjects, info.config.duplicate_window) == ([f"{prefix}.app.>", f"{prefix}.crm.>"], 45)


def test_databases_starting_together_all_end_up_captured(nc: WalflowClient, nats_srv: Nats, names: TestNames) -> None:
    """Processes of several databases creating and extending the same stream at once converge."""
    dest = _dest(nats_srv, names, stream={"name": names.stream})
    databases = [f"db{i}" for i in range(5)]

    async def together() -> None:
        await asyncio.gather(*(ensure_stream(nc, dest, db) for db in databases))
        # an update that raced another one may have dropped a subject: each process finds out
        # at its next publish ("no responders") and sets the stream up again, as this does
        await asyncio.gather(*(ensure_stream(nc, dest, db) for db in databases))

    runtime.run(together())
    assert sorted(_subjects(nc, names.stream)) == [f"{names.subject_prefix}.{db}.>" for db in databases]


def test_an_operators_stream_is_never_edited(nc: WalflowClient, nats_srv: Nats, names: TestNames) -> None:
    prefix = names.subject_prefix
    _add(nc, names.stream, [f"{prefix}.app.>"])  # the same subjects walflow would choose, but not created by it
    dest = _dest(nats_srv, names, stream={"name": names.stream})
    assert runtime.run(ensure_stream(nc, dest, "app")).name == names.stream
    with pytest.raises(StreamSetupError) as info:
        runtime.run(ensure_stream(nc, dest, "crm"))
    assert str(info.value).startswith(
        f"JetStream stream '{names.stream}' captures ['{prefix}.app.>'], not walflow's subjects '{prefix}.crm.>' "
        "for database 'crm': its events would be rejected."
    )
    assert _subjects(nc, names.stream) == [f"{prefix}.app.>"]


# -- the sink: events land in the stream found; Sequin-form ids do not share one ----------------


def _sink(nats_srv: Nats, names: TestNames, name: str, database: str = "app", **destination: Any) -> SinkConfig:
    return SinkConfig.model_validate(
        {"name": name, "database": database, "partition_count": 1,
         "destination": _destination(nats_srv, names, **destination)}
    )


def _prepare(sink: SinkConfig, database: str = "app", peers: list[SinkConfig] | None = None) -> SinkTarget:
    return SinkTarget.prepare(sink, database, runtime, replay_from=0,
                              scanned=database_subjects(sink.destination.subject_prefix, database), peers=peers or [])


def test_a_sinks_events_land_in_the_stream_found(
    nc: WalflowClient, nats_srv: Nats, names: TestNames, default_stream: str
) -> None:
    _add(nc, names.stream, [f"{names.subject_prefix}.>"])
    target = _prepare(_sink(nats_srv, names, "orders", msg_id="sequin"))
    try:
        assert target.horizon == 0
        assert target.stream.name == names.stream
        part = JetStreamSink(target).build_part("publish", "orders-0", None)
        part.write_batch([message(names.subject_prefix, "t", "insert", b"{}", target.ids.encode(lsn, 0).decode())
                          for lsn in (7, 8)])
        assert part.snapshot() == {"last_seq": 2, "last_id": target.ids.encode(8, 0).decode()}
        part.close()
    finally:
        target.close()
    assert runtime.run(nc.jetstream().stream_info(names.stream)).state.messages == 2
    assert not _exists(nc, default_stream)


def test_two_sinks_with_sequin_ids_in_one_stream_refuse_to_start(
    nc: WalflowClient, nats_srv: Nats, names: TestNames, default_stream: str, target_connections: list[WalflowClient]
) -> None:
    _add(nc, names.stream, [f"{names.subject_prefix}.>"])
    orders = _sink(nats_srv, names, "orders", msg_id="sequin")
    same_db = _sink(nats_srv, names, "audit", msg_id="sequin")
    other_db = _sink(nats_srv, names, "crm-out", database="crm", msg_id="sequin")
    walflow_ids = _sink(nats_srv, names, "audit", msg_id="walflow")
    disabled = SinkConfig.model_validate({**same_db.model_dump(exclude_unset=True), "status": "disabled"})
    elsewhere = _sink(nats_srv, names, "elsewhere", database="crm", msg_id="sequin", subject_prefix="other",
                      stream={"name": f"{names.stream}_X"})

    def start(peers: list[SinkConfig]) -> None:
        _prepare(orders, peers=[orders, *peers]).close()

    with pytest.raises(SharedSequinIdsError) as info:
        start([same_db])
    assert str(info.value) == (
        f"sinks 'orders' and 'audit' of database 'app' both publish into JetStream stream '{names.stream}' with "
        "destination.msg_id: sequin, whose ids name a change by its commit position only: JetStream would drop one "
        "sink's messages as duplicates of the other's. Set msg_id: walflow on one of them (its ids name database and "
        "sink), or have it publish into another stream"
    )
    with pytest.raises(SharedSequinIdsError, match=r"^sinks 'orders' \(database 'app'\) and 'crm-out' \(database "
                                                   r"'crm'\) both publish into JetStream stream .* wherever their "
                                                   "positions coincide"):
        start([other_db])
    start([walflow_ids, disabled, elsewhere])  # walflow's ids, a disabled sink, another stream: no clash
    assert not _exists(nc, f"{names.stream}_X")  # the peers' streams are only looked up
    assert len(target_connections) == 3 and all(client.is_closed for client in target_connections)  # refused ones too


def test_a_subject_lost_to_a_racing_update_is_added_again_at_the_next_publish(
    nc: WalflowClient, nats_srv: Nats, names: TestNames
) -> None:
    prefix = names.subject_prefix
    runtime.run(ensure_stream(nc, _dest(nats_srv, names, stream={"name": names.stream}), "app"))
    target = _prepare(_sink(nats_srv, names, "crm-out", database="crm", stream={"name": names.stream}), "crm")
    try:
        assert _subjects(nc, names.stream) == [f"{prefix}.app.>", f"{prefix}.crm.>"]
        part = JetStreamSink(target).build_part("publish", "crm-out-0", None)
        # another process's update, read before this one's, replaces the subjects whole
        config = runtime.run(nc.jetstream().stream_info(names.stream)).config
        config.subjects = [f"{prefix}.app.>"]
        runtime.run(nc.jetstream().update_stream(config))
        part.write_batch([message(prefix, "t", "insert", b"{}", target.ids.encode(9, 0).decode(), database="crm")])
        assert part.snapshot()["last_seq"] == 1  # "no responders", the stream set up again, re-sent
        part.close()
    finally:
        target.close()
    assert _subjects(nc, names.stream) == [f"{prefix}.app.>", f"{prefix}.crm.>"]
