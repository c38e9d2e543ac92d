"""The real pipeline, as users start it, from Postgres changes to what JetStream stores."""

from __future__ import annotations

import base64
from collections import defaultdict
from pathlib import Path
from typing import Any

import psycopg
import pytest

from embedded import wait_for
from tests.harness import Database, Nats, TestNames
from tests.harness import slot_active as _slot_active
from tests.harness import slot_confirmed as _confirmed
from tests.pipeline import assert_running, pipeline, run_workload, stored, write_config

pytestmark = pytest.mark.slow  # every test here runs the pipeline (python -m bytewax.run)


@pytest.fixture
def shop(database: Database) -> Database:
    with database.connect() as conn:
        conn.execute("CREATE SCHEMA sales")
        conn.execute("CREATE TABLE customers (id int PRIMARY KEY, name text, email text)")
        conn.execute("CREATE TABLE orders (id int PRIMARY KEY, customer_id int, status text, amount numeric(10,2))")
        conn.execute("ALTER TABLE orders REPLICA IDENTITY FULL")
        conn.execute("CREATE TABLE sales.invoices (id int PRIMARY KEY, total numeric, issued timestamptz)")
        conn.execute("CREATE TABLE secrets (id int PRIMARY KEY, token text)")
    return database


def _workload(conn: psycopg.Connection[Any]) -> None:
    conn.execute("INSERT INTO customers VALUES (1, 'Ada', 'ada@example.com')")
    with conn.transaction():
        conn.execute("INSERT INTO orders VALUES (10, 1, 'new', 12.50)")
        conn.execute("INSERT INTO secrets VALUES (1, 'hunter2')")
        conn.execute("INSERT INTO sales.invoices VALUES (100, 12.50, '2026-11-30 04:00:00.123456+00')")
    conn.execute("UPDATE customers SET email = 'ada@lovelace.org' WHERE id = 1")
    conn.execute("UPDATE orders SET status = 'paid' WHERE id = 10")
    conn.execute("UPDATE orders SET status = 'shipped' WHERE id = 10")
    conn.execute("UPDATE sales.invoices SET id = 101 WHERE id = 100")
    conn.execute("DELETE FROM secrets WHERE id = 1")
    conn.execute("DELETE FROM orders WHERE id = 10")
    conn.execute("DELETE FROM customers WHERE id = 1")
    conn.execute("INSERT INTO customers VALUES (2, 'Grace', NULL)")  # the last one: everything before it is in


def _run_workload(config: Path, shop: Database) -> None:
    run_workload(config, shop, _workload)


def test_the_stream_holds_exactly_the_contracts_messages(
    shop: Database, names: TestNames, nats_srv: Nats, stream_cleanup: str, tmp_path: Path
) -> None:
    sink = {
        "name": "shop-to-nats",
        "source": {"include_schemas": ["public", "sales"], "exclude_tables": ["public.secrets"]},
        "destination": {"subject_prefix": names.subject_prefix, "stream": {"name": names.stream}},
    }
    config = write_config(tmp_path, shop, nats_srv, names, [sink])
    _run_workload(config, shop)
    events = stored(nats_srv.url, names.stream)
    p = names.subject_prefix
    by_commit = sorted(events, key=lambda e: (e.event["metadata"]["commit_lsn"], e.event["metadata"]["commit_idx"]))
    assert [(e.subject, e.event["record"], e.event["changes"]) for e in by_commit] == [
        (f"{p}.shop.public.customers.insert", {"id": 1, "name": "Ada", "email": "ada@example.com"}, None),
        (f"{p}.shop.public.orders.insert", {"id": 10, "customer_id": 1, "status": "new", "amount": "12.50"}, None),
        (f"{p}.shop.sales.invoices.insert", {"id": 100, "total": "12.50", "issued": "2026-11-30T04:00:00.123456Z"}, None),
        (f"{p}.shop.public.customers.update", {"id": 1, "name": "Ada", "email": "ada@lovelace.org"}, {}),
        (f"{p}.shop.public.orders.update", {"id": 10, "customer_id": 1, "status": "paid", "amount": "12.50"},
         {"status": "new"}),
        (f"{p}.shop.public.orders.update", {"id": 10, "customer_id": 1, "status": "shipped", "amount": "12.50"},
         {"status": "paid"}),
        (f"{p}.shop.sales.invoices.update", {"id": 101, "total": "12.50", "issued": "2026-11-30T04:00:00.123456Z"},
         {"id": 100}),
        (f"{p}.shop.public.orders.delete", {"id": 10, "customer_id": 1, "status": "shipped", "amount": "12.50"}, None),
        (f"{p}.shop.public.customers.delete", {"id": 1, "name": None, "email": None}, None),
        (f"{p}.shop.public.customers.insert", {"id": 2, "name": "Grace", "email": None}, None),
    ]
    for e in events:
        meta = e.event["metadata"]
        assert e.msg_id == meta["idempotency_key"]
        assert base64.b64decode(e.msg_id).decode() == f"shop/shop-to-nats/{meta['commit_lsn']}:{meta['commit_idx']}"
        assert meta["database_name"] == "shop" and meta["consumer"]["name"] == "shop-to-nats"
        assert e.subject.split(".")[-1] == e.event["action"] and e.subject.split(".")[-3] == meta["table_schema"]
        assert meta["commit_timestamp"].endswith("Z") and len(meta["commit_timestamp"]) == 27
    assert len({e.msg_id for e in events}) == len(events)
    per_row: dict[str, list[int]] = defaultdict(list)  # stream order per row follows commit order
    for e in events:
        key = f"{e.subject.rsplit('.', 1)[0]}:{e.event['record']['id']}"
        per_row[key].append(e.event["metadata"]["commit_lsn"])
    assert all(lsns == sorted(lsns) for lsns in per_row.values())



def test_two_sinks_each_get_their_own_messages(
    shop: Database, names: TestNames, nats_srv: Nats, stream_cleanup: str, tmp_path: Path
) -> None:
    a, b = f"{names.subject_prefix}a", f"{names.subject_prefix}b"
    stream = {"name": names.stream, "subjects": [f"{a}.>", f"{b}.>"]}
    sinks = [
        {"name": "customers-only", "source": {"include_tables": ["public.customers"]},
         "destination": {"subject_prefix": a, "stream": stream}},
        {"name": "inserts-elsewhere", "actions": ["insert"], "source": {"exclude_tables": ["public.customers"]},
         "destination": {"subject_prefix": b, "stream": stream}},
        {"name": "switched-off", "status": "disabled", "destination": {"subject_prefix": a, "stream": stream}},
    ]
    config = write_config(tmp_path, shop, nats_srv, names, sinks)
    _run_workload(config, shop)
    events = stored(nats_srv.url, names.stream)
    got = sorted((e.subject.split(".", 1)[0], e.subject.split(".", 2)[2]) for e in events)
    assert got == sorted([
        (a, "public.customers.insert"), (a, "public.customers.update"), (a, "public.customers.delete"),
        (a, "public.customers.insert"),
        (b, "public.orders.insert"), (b, "public.secrets.insert"), (b, "sales.invoices.insert"),
    ])
    assert {e.event["metadata"]["consumer"]["name"] for e in events} == {"customers-only", "inserts-elsewhere"}


def test_nats_unreachable_at_start_then_flows(
    shop: Database, names: TestNames, nats_srv: Nats, stream_cleanup: str, tmp_path: Path
) -> None:
    sink = {"name": "late", "destination": {"subject_prefix": names.subject_prefix, "stream": {"name": names.stream}}}
    config = write_config(tmp_path, shop, nats_srv, names, [sink])
    nats_srv.stop()
    with pipeline(config, "-s", "1") as proc:
        wait_for(lambda: "cannot reach NATS" in proc.log_tail(), timeout=30, what="the retry warning",
                 check=lambda: assert_running(proc))
        nats_srv.start()
        wait_for(lambda: _slot_active(shop), timeout=60, what="the pipeline to open its slot",
                 check=lambda: assert_running(proc))
        with shop.connect() as conn:
            conn.execute("INSERT INTO customers VALUES (1, 'Ada', NULL)")
        end = shop.current_lsn()
        wait_for(lambda: _confirmed(shop) >= end, timeout=60, what="the slot to pass the insert",
                 check=lambda: assert_running(proc))
    events = stored(nats_srv.url, names.stream)
    assert [(e.event["action"], e.event["record"]) for e in events] == [("insert", {"id": 1, "name": "Ada", "email": None})]


def test_stream_with_other_subjects_stops_with_a_clear_error(
    shop: Database, names: TestNames, nats_srv: Nats, stream_cleanup: str, tmp_path: Path
) -> None:
    import asyncio

    import nats

    async def create_foreign_stream() -> None:
        nc = await nats.connect(nats_srv.url)
        await nc.jetstream().add_stream(name=names.stream, subjects=["somebody.else.>"])
        await nc.close()

    asyncio.run(create_foreign_stream())
    sink = {"name": "clash", "destination": {"subject_prefix": names.subject_prefix, "stream": {"name": names.stream}}}
    config = write_config(tmp_path, shop, nats_srv, names, [sink])
    with pipeline(config, "-s", "1") as proc:
        wait_for(lambda: not proc.running, timeout=60, what="the pipeline to stop")
        log = proc.log_tail(200)
    assert not _slot_active(shop)
    assert f"walflow: JetStream stream '{names.stream}' captures ['somebody.else.>'], not walflow's subjects" in log
