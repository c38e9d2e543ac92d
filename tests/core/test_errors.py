"""The taxonomy's tables: a SQLSTATE is found by its code, else its class, else the default."""

from __future__ import annotations

import pytest

from core.errors import (
    BACKFILL_QUERY,
    ReplicationSetupError,
    SlotInUse,
    StreamError,
    by_sqlstate,
    replication_error,
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
