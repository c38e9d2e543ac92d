"""A row keeps its group key when walflow reads a table's changes after DDL changed or dropped it.

Under REPLICA IDENTITY FULL the key comes from the catalog, which walflow reads when a
Relation message arrives: by then, when walflow lags behind, the table may be altered or
gone. Here walflow lags by construction: the WAL is read back after the DDL committed, in
two stages, the first while the table still exists. Every change of a row must get the
same group key (one partition, so commit order), also when the second stage is read by a
new session (a reconnect), as the supervisor runs it.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

import psycopg
import pytest

from connectors.postgres.connection import conninfo
from connectors.postgres.decoder import Decoder, ResumePoint
from connectors.postgres.types import Catalog
from core.events import RawChange
from tests.harness import Database, TestNames
from tests.replication import slot_messages
from tests.transforms.samples import make_sink
from transforms.group import GroupKey

_HEADER = struct.Struct("!cQQq")


@pytest.fixture
def full_table(database: Database, names: TestNames) -> Iterator[Database]:
    with database.connect() as conn:
        conn.execute("CREATE TABLE accounts (id int PRIMARY KEY, balance int)")
        conn.execute("ALTER TABLE accounts REPLICA IDENTITY FULL")
        conn.execute(f"CREATE PUBLICATION {names.publication} FOR TABLE accounts")
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", [names.slot])
    yield database


def _read(db: Database, names: TestNames, upto: int) -> list[bytes]:
    with db.connect() as conn:
        return slot_messages(conn, names.slot, names.publication, upto=upto, consume=True)


@pytest.mark.parametrize("reconnect", [False, True], ids=["one session", "a reconnect between"])
@pytest.mark.parametrize("ddl", ["DROP TABLE accounts", "ALTER TABLE accounts DROP CONSTRAINT accounts_pkey"])
def test_a_rows_changes_keep_one_group_across_ddl(full_table: Database, names: TestNames, ddl: str,
                                                  reconnect: bool) -> None:
    with full_table.connect() as conn:
        conn.execute("INSERT INTO accounts SELECT g, 0 FROM generate_series(1, 20) g")
    first_stage = full_table.current_lsn()
    with full_table.connect() as conn:
        conn.execute("ALTER TABLE accounts ADD COLUMN note text")  # a new Relation message for what follows
        conn.execute("UPDATE accounts SET balance = id * 10")
        conn.execute("DELETE FROM accounts WHERE id % 2 = 0")
    second_stage = full_table.current_lsn()
    config = full_table.config(create=False)
    key = GroupKey(make_sink())
    keys: dict[int, tuple[str, ...]] = {}  # what the supervisor keeps across its sessions
    changes: list[RawChange] = []
    with psycopg.connect(conninfo(config, application_name="test"), autocommit=True) as meta:
        decoder = Decoder(Catalog(meta, keys), ResumePoint())
        for message in _read(full_table, names, first_stage):  # read while the table is as it was
            decoder.feed(message)
        with full_table.connect() as conn:
            conn.execute(ddl)  # walflow lags: the DDL commits before it reads the rest
        if reconnect:
            decoder = Decoder(Catalog(meta, keys), ResumePoint())
        for message in _read(full_table, names, second_stage):
            decoder.feed(message)
        changes = [item for item in decoder.take()[0] if isinstance(item, RawChange)]
    by_row: dict[bytes, set[str]] = {}
    for change in changes:
        row = change.old if change.action == "delete" else change.new
        assert row is not None and isinstance(row[0], bytes)
        by_row.setdefault(row[0], set()).add(key(change))
    assert len(by_row) == 20 and sum(c.action == "delete" for c in changes) == 10
    assert all(groups == {f'public.accounts:["{row.decode()}"]'} for row, groups in by_row.items()), by_row
