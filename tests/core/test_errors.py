"""The taxonomy's tables: a SQLSTATE is found by its code, else its class, else the default; JetStream's
codes the same way; a NATS server's error by its words."""

from __future__ import annotations

import pytest

from core.errors import (
    BACKFILL_QUERY,
    JETSTREAM_PUBLISH,
    FatalError,
    NatsAuthError,
    NatsPermissionError,
    NatsUnavailable,
    NoStreamError,
    PublishError,
    PublishFailed,
    PublishRefused,
    ReplicationSetupError,
    SlotInUse,
    StreamError,
    TransientError,
    WalflowError,
    by_code,
    by_sqlstate,
    nats_error,
    replication_error,
    stream_outcome,
)


@pytest.mark.parametrize(("sqlstate", "outcome"), [
    ("57014", "shrink"),  # statement_timeout
    ("42P01", "end"),  # the table was dropped: by its class
    ("42501", "end"),  # SELECT revoked
    ("22P02", "end"),  # a start position its column cannot hold
    ("08006", "retry"),  # the connection broke
    (None, "retry"),
    ("", "retry"),
])
def test_a_backfill_query_error_is_sorted_by_code_then_class(sqlstate: str | None, outcome: str) -> None:
    assert by_sqlstate(BACKFILL_QUERY, sqlstate, "retry") == outcome


def test_replication_errors_an_operator_must_fix_say_what_to_do() -> None:
    invalidated = replication_error("can no longer get changes", "55000", "s1")
    assert isinstance(invalidated, ReplicationSetupError)
    assert "SELECT pg_drop_replication_slot('s1')" in str(invalidated)
    assert isinstance(replication_error("publication does not exist", "42704", "s1"), ReplicationSetupError)


def test_a_held_slot_and_everything_else_are_retried() -> None:
    held = replication_error("slot is active for PID 7", "55006", "s1")
    assert isinstance(held, SlotInUse) and held.sqlstate == "55006"
    other = replication_error("terminating connection", "57P01", "s1")
    assert type(other) is StreamError and other.sqlstate == "57P01"
    assert type(replication_error("lost", None, "s1")) is StreamError


# -- NATS and JetStream ----------------------------------------------------------------------------


@pytest.mark.parametrize(("code", "kind"), [
    (408, PublishFailed), (409, PublishFailed), (429, PublishFailed),  # pass by themselves
    (400, PublishRefused), (413, PublishRefused), (404, PublishRefused),  # 4xx: a bad header, too large
    (500, PublishFailed), (503, PublishFailed),  # the server's side: by its class
    (200, PublishRefused), (0, PublishRefused),  # nothing JetStream answers with an error: not retried
])
def test_a_publish_error_is_sorted_by_code_then_class(code: int, kind: type[PublishError]) -> None:
    found = by_code(JETSTREAM_PUBLISH, code, PublishRefused)
    assert found is kind
    error = found("why", str(code))
    assert (error.retryable, error.code) == (kind is PublishFailed, str(code))
    assert isinstance(error, TransientError if kind is PublishFailed else FatalError)


def test_no_stream_is_retried_under_jetstreams_503() -> None:
    error = NoStreamError("wf.app.public.t.insert")
    assert (error.retryable, error.code, str(error)) == (
        True, "503", "no responders on wf.app.public.t.insert: the stream has no leader (an election) or is gone")


@pytest.mark.parametrize(("code", "err_code", "outcome"), [
    (400, 10058, "again"),  # stream name already in use: another process created it
    (400, 10065, "again"),  # subjects overlap
    (400, 10052, "refused"),  # any other bad request: by its code
    (404, 10059, "missing"),
    (503, 10039, None),  # JetStream not available: raised as it is
    (500, None, None),
    (None, None, None),
])
def test_a_stream_api_error_is_sorted_by_err_code_then_code(code: int | None, err_code: int | None,
                                                            outcome: str | None) -> None:
    assert stream_outcome(code, err_code) == outcome


@pytest.mark.parametrize(("text", "kind"), [
    ("nats: 'Authorization Violation'", NatsAuthError),
    ("nats: 'Permissions Violation for Publish to \"$JS.API.STREAM.INFO.X\"'", NatsPermissionError),
    ("nats: 'Stale Connection'", NatsUnavailable),
    ("[Errno 111] Connect call failed ('127.0.0.1', 4222)", NatsUnavailable),
    ("", NatsUnavailable),
])
def test_a_nats_server_error_is_sorted_by_its_words(text: str, kind: type[WalflowError]) -> None:
    assert nats_error(text) is kind
