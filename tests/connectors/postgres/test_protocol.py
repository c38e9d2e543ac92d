"""Wire timestamps: exact to the microsecond, whichever way they are computed."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from connectors.postgres.connection import conninfo
from connectors.postgres.protocol import PG_EPOCH, pg_timestamp
from connectors.postgres.types import Catalog, _commit_time
from tests.harness import Database

_MICROSECOND = timedelta(microseconds=1)
_FIRST_US = (datetime(1, 1, 1, tzinfo=UTC) - PG_EPOCH) // _MICROSECOND
_LAST_US = (datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC) - PG_EPOCH) // _MICROSECOND


@given(st.integers(_FIRST_US - 10**12, _LAST_US + 10**12) | st.integers(-(2**63), 2**63 - 1)
       | st.integers(7 * 10**14, 9 * 10**14))
def test_pg_timestamp_is_the_exact_sum(us: int) -> None:
    try:
        expected = PG_EPOCH + timedelta(microseconds=us)
    except OverflowError:
        with pytest.raises(OverflowError):
            pg_timestamp(us)
        return
    got = pg_timestamp(us)
    assert got == expected and got.tzinfo is UTC


def test_pg_timestamp_at_the_ends_of_the_range() -> None:
    for us in (_FIRST_US, _LAST_US, 0, -1, 1):
        assert pg_timestamp(us) == PG_EPOCH + timedelta(microseconds=us)
    for us in (_FIRST_US - 1, _LAST_US + 1):
        with pytest.raises(OverflowError):
            pg_timestamp(us)


@pytest.fixture
def catalog(database: Database) -> Iterator[Catalog]:
    with psycopg.connect(conninfo(database.config(create=False), application_name="test"), autocommit=True) as conn:
        yield Catalog(conn)


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(us=st.integers(_FIRST_US - 10**12, _LAST_US + 10**12) | st.integers(-(2**63), 2**63 - 1)
       | st.sampled_from([_FIRST_US, _LAST_US, _FIRST_US - 1, _LAST_US + 1, 0, -1]))
def test_commit_times_through_psycopg_are_pg_timestamp(catalog: Catalog, us: int) -> None:
    raw = struct.pack("!q", us)
    for load in (catalog.commit_time, _commit_time):
        try:
            expected = pg_timestamp(us)
        except OverflowError:
            with pytest.raises(psycopg.DataError):
                load(raw)
            continue
        got = load(raw)
        assert got == expected and got.tzinfo is expected.tzinfo
    assert catalog.commit_time is not _commit_time  # psycopg's loader: TimeZone is UTC
