"""Every database of the config in one flow: one source partition per slot, spread over the
processes of a cluster; ``WALFLOW_DATABASE`` narrows a flow to one database."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
import yaml

from embedded._process import free_port, wait_for
from tests.harness import Database, Nats, Postgres, TestNames, slot_confirmed
from tests.pipeline import assert_running, fatal_line, pipeline, run_to_exit, stored, write_config

ROWS = 300


@pytest.fixture
def crm(pg: Postgres, names: TestNames) -> Iterator[Database]:
    """A second database on the same server, with a slot and publication of its own."""
    with Database.created(pg, TestNames.for_test(f"crm_{names.database}")) as db:
        yield db


def _two_databases(tmp_path: Path, shop: Database, crm: Database, nats_srv: Nats, names: TestNames) -> Path:
    """A config with databases ``shop`` and ``crm``, a sink each, one stream for both."""
    destination = {"subject_prefix": names.subject_prefix, "stream": {"name": names.stream}}
    config = write_config(tmp_path, shop, nats_srv, names, [{"name": "shop-out", "destination": destination}])
    doc: dict[str, Any] = yaml.safe_load(config.read_text())
    second = dict(doc["databases"][0], name="crm", database=crm.names.database,
                  slot={"name": crm.names.slot, "create_if_not_exists": True},
                  publication={"name": crm.names.publication, "create_if_not_exists": True})
    doc["databases"].append(second)
    doc["sinks"].append(dict(doc["sinks"][0], name="crm-out", database="crm"))
    config.write_text(yaml.safe_dump(doc))
    return config


def _write(db: Database, table: str) -> int:
    """``ROWS`` inserts, then an update of each, in single-row transactions; the LSN after them."""
    with db.connect() as conn:
        conn.execute(f"CREATE TABLE IF NOT EXISTS {table} (id int PRIMARY KEY, v int NOT NULL)")
        for i in range(ROWS):
            conn.execute(f"INSERT INTO {table} VALUES (%s, 0)", [i])
        for i in range(ROWS):
            conn.execute(f"UPDATE {table} SET v = 1 WHERE id = %s", [i])
    return db.current_lsn()


@pytest.mark.slow
def test_a_two_process_flow_reads_both_databases_one_slot_in_each_process(
    tmp_path: Path, database: Database, crm: Database, nats_srv: Nats, names: TestNames, stream_cleanup: str
) -> None:
    config = _two_databases(tmp_path, database, crm, nats_srv, names)
    for db in (database, crm):  # the tables exist before the flow starts, so the publications can list them
        with db.connect() as conn:
            conn.execute("CREATE TABLE items (id int PRIMARY KEY, v int NOT NULL)")
    addresses = f"127.0.0.1:{free_port()};127.0.0.1:{free_port()}"
    with ExitStack() as stack:
        procs = [stack.enter_context(pipeline(config, "-s", "1", "-i", str(i), "-a", addresses, log_suffix=f".{i}"))
                 for i in (0, 1)]
        def confirmed_past(db: Database, lsn: int) -> Callable[[], bool]:
            return lambda: slot_confirmed(db) > lsn

        for db in (database, crm):
            wait_for(confirmed_past(db, 0), timeout=60, what=f"{db.names.slot} to be read",
                     check=lambda: assert_running(*procs))
        ends = {"shop": _write(database, "items"), "crm": _write(crm, "items")}
        for db, end in ((database, ends["shop"]), (crm, ends["crm"])):
            wait_for(confirmed_past(db, end - 1), timeout=120, what=f"{db.names.slot} to be confirmed past its writes",
                     check=lambda: assert_running(*procs))
        logs = [p.log_tail(400) for p in procs]
    events = stored(nats_srv.url, names.stream)
    for name in ("shop", "crm"):
        mine = [e for e in events if e.event["metadata"]["database_name"] == name]
        assert len(mine) == 2 * ROWS and len({e.msg_id for e in mine}) == 2 * ROWS
        assert all(e.subject.startswith(f"{names.subject_prefix}.{name}.public.items.") for e in mine)
        for i in range(ROWS):  # each row: its insert, then its update
            actions = [e.event["action"] for e in mine if e.event["record"]["id"] == i]
            assert actions == ["insert", "update"], (name, i, actions)
    # one slot per process: Bytewax gave each partition of the source its own worker
    reading = [sorted(slot for slot in (database.names.slot, crm.names.slot) if f"streaming slot {slot}" in log)
               for log in logs]
    assert sorted(len(r) for r in reading) == [1, 1], reading


@pytest.mark.slow
def test_walflow_database_narrows_the_flow_to_one_database(
    tmp_path: Path, database: Database, crm: Database, nats_srv: Nats, names: TestNames, stream_cleanup: str
) -> None:
    config = _two_databases(tmp_path, database, crm, nats_srv, names)
    with pipeline(config, "-s", "1", env={"WALFLOW_DATABASE": "crm"}) as proc:
        wait_for(lambda: slot_confirmed(crm) > 0, timeout=60, what="crm's slot", check=lambda: assert_running(proc))
        end = _write(crm, "items")
        _write(database, "items")
        wait_for(lambda: slot_confirmed(crm) >= end, timeout=60, what="crm's writes", check=lambda: assert_running(proc))
        log = proc.log_tail(400)
    assert f"streaming slot {database.names.slot}" not in log
    events = stored(nats_srv.url, names.stream)
    assert len(events) == 2 * ROWS and {e.event["metadata"]["database_name"] for e in events} == {"crm"}


@pytest.mark.slow
def test_two_databases_of_one_flow_with_one_slot_name_are_refused_with_the_fix(
    tmp_path: Path, database: Database, crm: Database, nats_srv: Nats, names: TestNames
) -> None:
    """A flow keys each slot's position by its name: two databases whose slots share one
    (each on its own server, say) cannot be told apart, so the flow refuses to start."""
    config = _two_databases(tmp_path, database, crm, nats_srv, names)
    doc: dict[str, Any] = yaml.safe_load(config.read_text())
    doc["databases"][1]["slot"]["name"] = doc["databases"][0]["slot"]["name"]
    config.write_text(yaml.safe_dump(doc))
    done = run_to_exit(config)
    assert fatal_line(done) == "walflow: invalid walflow config databases:"
    assert "both name their slot" in done.stderr and "WALFLOW_DATABASE=<name>" in done.stderr, done.stderr
