"""Shaping, end to end: columns and masks, row filters, transforms, routing, enrichment, the
Debezium envelope, the TOAST policy and the failure policy, each configured in YAML (and
Python callables beside the config), through the real pipeline into JetStream.

Masked and excluded values are chosen to be unmistakable and looked for in the raw bytes of
every stored message: subject, headers and payload.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
import textwrap
from pathlib import Path
from typing import Any

import psycopg
import pytest

from embedded import wait_for
from tests.harness import Database, Nats, TestNames
from tests.harness import slot_active as _slot_active
from tests.harness import slot_confirmed as _confirmed
from tests.pipeline import (
    Stored,
    assert_running,
    fatal_line,
    pipeline,
    run_to_exit,
    run_workload,
    stored,
    write_config,
)

pytestmark = pytest.mark.slow  # every test here runs the pipeline (python -m bytewax.run)

SECRET = "a-secret-for-the-tests"
#: Values that must never reach the stream in clear.
CLEAR = [b"ada.private@example.com", b"999-88-7777", b"4111111111114242", b"TOPSECRET-NOTE", b"grace.h@example.com"]


@pytest.fixture
def shop(database: Database) -> Database:
    with database.connect() as conn:
        conn.execute("CREATE TABLE customers (id int PRIMARY KEY, name text, email text, ssn text, card text, "
                     "notes text, tenant text)")
        conn.execute("ALTER TABLE customers REPLICA IDENTITY FULL")
        conn.execute("CREATE TABLE orders (id int PRIMARY KEY, customer_id int, status text, amount numeric(10,2), "
                     "info jsonb)")
        conn.execute("ALTER TABLE orders REPLICA IDENTITY FULL")
    return database


def _workload(conn: psycopg.Connection[Any]) -> None:
    conn.execute("INSERT INTO customers VALUES (1, 'Ada', 'ada.private@example.com', '999-88-7777', "
                 "'4111111111114242', 'TOPSECRET-NOTE', 'acme')")
    conn.execute("INSERT INTO customers VALUES (2, 'Grace', 'grace.h@example.com', NULL, NULL, NULL, 'globex')")
    conn.execute("UPDATE customers SET email = 'ada@example.org', notes = 'plain' WHERE id = 1")
    conn.execute("INSERT INTO orders VALUES (10, 1, 'new', 50.00, '{\"channel\": \"web\"}')")
    conn.execute("INSERT INTO orders VALUES (11, 2, 'paid', 250.00, '{\"channel\": \"shop\"}')")
    conn.execute("UPDATE orders SET status = 'paid' WHERE id = 10")
    conn.execute("UPDATE orders SET status = 'shipped', amount = 120.00 WHERE id = 10")
    conn.execute("DELETE FROM orders WHERE id = 11")
    conn.execute("DELETE FROM customers WHERE id = 2")


def _run(config: Path, db: Database, workload: Any = _workload, *args: str) -> None:
    run_workload(config, db, workload, *args)


def _module(tmp_path: Path, name: str, source: str) -> None:
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))


def _hash(value: str) -> str:
    return hmac.new(SECRET.encode(), value.encode(), hashlib.sha256).hexdigest()


def _on(events: list[Stored], prefix: str) -> list[Stored]:
    return [e for e in events if e.subject.startswith(prefix + ".")]


def _raw(e: Stored) -> bytes:
    return e.subject.encode() + json.dumps(e.headers).encode() + e.data


def test_columns_filters_routing_transforms_and_debezium_in_one_run(
    shop: Database, names: TestNames, nats_srv: Nats, stream_cleanup: str, tmp_path: Path
) -> None:
    p = names.subject_prefix
    prefixes = {kind: f"{p}{kind}" for kind in ("mask", "rows", "py", "dbz", "path")}
    stream = {"name": names.stream, "subjects": [f"{x}.>" for x in prefixes.values()]}

    def dest(kind: str) -> dict[str, Any]:
        return {"subject_prefix": prefixes[kind], "stream": stream}

    _module(tmp_path, "shaping_fns", """
        def big_or_vip(action, record, changes, metadata):
            assert metadata["table_name"] == "orders"
            return record["customer_id"] == 2 or action == "delete"

        def summary(action, record, changes, metadata):
            return {"id": record["id"], "act": action, "status": record["status"],
                    "changed": sorted(changes or {}), "pks": metadata["record_pks"]}

        def route(action, record, changes, metadata):
            return {"subject": "%s.custom.%s.%s" % (metadata["consumer"]["annotations"]["prefix"],
                                                    record["status"], action),
                    "headers": {"X-Status": record["status"]}}
        """)
    customers = {
        "name": "public.customers",
        "columns": {"exclude": ["ssn"], "rename": {"email": "contact"},
                    "mask": {"email": "hash", "card": {"keep_last": 4}, "notes": "redact", "name": {"keep_first": 1}}},
    }
    sinks: list[dict[str, Any]] = [
        {"name": "masked", "source": {"include_tables": ["public.customers"]}, "tables": [customers],
         "routing": {"subject": "{prefix}.{table}.{record.contact}.{action}", "key_header": "Walflow-Key"},
         "destination": dest("mask")},
        {"name": "rows", "source": {"include_tables": ["public.orders"]},
         "tables": [{"name": "public.orders",
                     "where": [{"column": "status", "in": ["paid", "shipped"]}, {"column": "amount", "gt": 100}],
                     "filters": [{"column_name": "info", "field_path": "channel", "operator": "!=",
                                  "comparison_value": "fax"}]}],
         "destination": dest("rows")},
        {"name": "py", "source": {"include_tables": ["public.orders"]}, "annotations": {"prefix": prefixes["py"]},
         "filter": {"python": "shaping_fns:big_or_vip"}, "transform": {"python": "shaping_fns:summary"},
         "routing": {"python": "shaping_fns:route"}, "destination": dest("py")},
        {"name": "dbz", "source": {"include_tables": ["public.orders"]}, "envelope": "debezium",
         "destination": dest("dbz")},
        {"name": "path", "source": {"include_tables": ["public.orders"]}, "transform": "order-id",
         "destination": dest("path")},
    ]
    for s in sinks:
        s["partition_count"] = 1  # one order for the whole sink: the expected lists are in commit order
    config = write_config(tmp_path, shop, nats_srv, names, sinks,
                          functions=[{"name": "order-id", "type": "path", "path": "record.id"}], mask_secret=SECRET)
    _run(config, shop)
    events = stored(nats_srv.url, names.stream)

    # columns: nothing in clear anywhere, the rest as configured
    for e in events:
        for value in CLEAR:
            assert value not in _raw(e), (value, e)
    masked = _on(events, prefixes["mask"])
    assert [(e.event["action"], e.event["record"]) for e in masked] == [
        ("insert", {"id": 1, "name": "A**", "contact": _hash("ada.private@example.com"), "card": "************4242",
                    "notes": "[redacted]", "tenant": "acme"}),
        ("insert", {"id": 2, "name": "G****", "contact": _hash("grace.h@example.com"), "card": None, "notes": None,
                    "tenant": "globex"}),
        ("update", {"id": 1, "name": "A**", "contact": _hash("ada@example.org"), "card": "************4242",
                    "notes": "[redacted]", "tenant": "acme"}),
        ("delete", {"id": 2, "name": "G****", "contact": _hash("grace.h@example.com"), "card": None, "notes": None,
                    "tenant": "globex"}),
    ]
    assert masked[2].event["changes"] == {"contact": _hash("ada.private@example.com"), "notes": "[redacted]"}
    assert [e.subject for e in masked] == [
        f"{prefixes['mask']}.customers.{_hash('ada.private@example.com')}.insert",
        f"{prefixes['mask']}.customers.{_hash('grace.h@example.com')}.insert",
        f"{prefixes['mask']}.customers.{_hash('ada@example.org')}.update",
        f"{prefixes['mask']}.customers.{_hash('grace.h@example.com')}.delete",
    ]
    assert [e.headers.get("Walflow-Key") for e in masked] == ['["1"]', '["2"]', '["1"]', '["2"]']
    assert all(e.msg_id == e.event["metadata"]["idempotency_key"] for e in masked)

    # row filters: status in (paid, shipped) and amount > 100, and Sequin's filter on a JSON field
    rows = _on(events, prefixes["rows"])
    assert [(e.event["action"], e.event["record"]["id"], e.event["record"]["status"]) for e in rows] == [
        ("insert", 11, "paid"), ("update", 10, "shipped"), ("delete", 11, "paid")]

    # Python filter, transform and routing (with headers), Nats-Msg-Id kept
    py = _on(events, prefixes["py"])
    assert [(e.subject, e.headers.get("X-Status"), e.event) for e in py] == [
        (f"{prefixes['py']}.custom.paid.insert", "paid",
         {"id": 11, "act": "insert", "status": "paid", "changed": [], "pks": ["11"]}),
        (f"{prefixes['py']}.custom.paid.delete", "paid",
         {"id": 11, "act": "delete", "status": "paid", "changed": [], "pks": ["11"]}),
    ]
    assert all(base64.b64decode(e.msg_id).decode().startswith("shop/py/") for e in py)

    # Debezium's envelope
    dbz = _on(events, prefixes["dbz"])
    by_row: dict[int, list[tuple[str, str | None, str | None]]] = {}  # each row's in commit order; rows interleave
    for e in dbz:
        before, after = e.event["before"], e.event["after"]
        by_row.setdefault((after or before)["id"], []).append(
            (e.event["op"], before and before["status"], after and after["status"]))
    assert by_row == {10: [("c", None, "new"), ("u", "new", "paid"), ("u", "paid", "shipped")],
                      11: [("c", None, "paid"), ("d", "paid", None)]}
    source = dbz[0].event["source"]
    assert (source["connector"], source["schema"], source["table"], source["db"]) == (
        "postgresql", "public", "orders", names.database)
    assert source["lsn"] > 0 and isinstance(source["txId"], int) and source["snapshot"] == "false"
    assert dbz[0].subject == f"{prefixes['dbz']}.shop.public.orders.insert"

    # a Sequin path function
    assert sorted(e.event for e in _on(events, prefixes["path"])) == [10, 10, 10, 11, 11]  # rows interleave freely


def test_a_failing_function_stops_with_the_rows_position_and_a_restart_after_the_fix_publishes_it(
    shop: Database, names: TestNames, nats_srv: Nats, stream_cleanup: str, tmp_path: Path
) -> None:
    _module(tmp_path, "picky", """
        def keep(action, record, changes, metadata):
            if record["id"] == 13:
                raise ValueError("cannot judge order 13")
            return True
        """)
    sink = {"name": "picky", "source": {"include_tables": ["public.orders"]}, "filter": {"python": "picky:keep"}, "partition_count": 1,
            "destination": {"subject_prefix": names.subject_prefix, "stream": {"name": names.stream}}}
    config = write_config(tmp_path, shop, nats_srv, names, [sink])
    with pipeline(config, "-s", "1") as proc:
        wait_for(lambda: _slot_active(shop), timeout=60, what="the pipeline to open its slot",
                 check=lambda: assert_running(proc))
        with shop.connect() as conn:
            conn.execute("INSERT INTO orders VALUES (12, 1, 'new', 1, NULL)")
        before = shop.current_lsn()
        wait_for(lambda: _confirmed(shop) >= before, timeout=60, what="the first order to be confirmed",
                 check=lambda: assert_running(proc))
        with shop.connect() as conn:
            conn.execute("INSERT INTO orders VALUES (13, 1, 'new', 1, NULL)")
            conn.execute("INSERT INTO orders VALUES (14, 1, 'new', 1, NULL)")
        wait_for(lambda: not proc.running, timeout=60, what="the pipeline to stop")
        log = proc.log_tail(60)
    found = re.search(r"filter picky:keep failed for public\.orders insert at commit LSN ([0-9A-F]+)/([0-9A-F]+)", log)
    assert found is not None, log
    assert "ValueError. Nothing at or after it is confirmed" in log and "cannot judge order 13" not in log, log
    assert _confirmed(shop) < (int(found.group(1), 16) << 32) + int(found.group(2), 16)  # not past the row
    assert [e.event["record"]["id"] for e in stored(nats_srv.url, names.stream)] == [12]

    done = run_to_exit(config, timeout=60)  # still failing: the same one line, nothing published past it
    assert "ValueError" in fatal_line(done) and "cannot judge order 13" not in fatal_line(done)
    assert [e.event["record"]["id"] for e in stored(nats_srv.url, names.stream)] == [12]

    _module(tmp_path, "picky", """
        def keep(action, record, changes, metadata):
            return True
        """)
    _run(config, shop, lambda conn: conn.execute("INSERT INTO orders VALUES (15, 1, 'new', 1, NULL)"))
    events = stored(nats_srv.url, names.stream)
    assert [e.event["record"]["id"] for e in events] == [12, 13, 14, 15]
    assert len({e.msg_id for e in events}) == 4


def test_dead_letters_take_the_failing_rows_place_and_the_slot_moves_on(
    shop: Database, names: TestNames, nats_srv: Nats, stream_cleanup: str, tmp_path: Path
) -> None:
    _module(tmp_path, "fragile", """
        def shape(action, record, changes, metadata):
            if record["id"] == 21:
                return {"not json": {1, 2}}
            if record["id"] == 22:
                raise KeyError("boom")
            return {"id": record["id"]}
        """)
    p = names.subject_prefix
    sink = {"name": "fragile", "source": {"include_tables": ["public.orders"]},
            "transform": {"python": "fragile:shape"}, "on_error": "dead_letter",
            "routing": {"subject": "{prefix}.{database}.orders.{record.status}"}, "partition_count": 1,
            "destination": {"subject_prefix": p, "stream": {"name": names.stream}}}
    config = write_config(tmp_path, shop, nats_srv, names, [sink])

    def workload(conn: psycopg.Connection[Any]) -> None:
        for i, status in ((20, "new"), (21, "new"), (22, "new"), (23, "bad status")):
            conn.execute("INSERT INTO orders VALUES (%s, 1, %s, 1, NULL)", (i, status))

    _run(config, shop, workload)
    events = stored(nats_srv.url, names.stream)
    assert [(e.subject, e.event.get("id") if "error" not in e.event else e.event["error"]["step"])
            for e in events] == [
        (f"{p}.shop.orders.new", 20),
        (f"{p}.shop.dead_letter", "transform"),
        (f"{p}.shop.dead_letter", "transform"),
        (f"{p}.shop.orders.bad%20status", 23),
    ]
    dead = events[1].event
    assert dead["error"]["message"] == "transform fragile:shape returned a set, which is not JSON"
    assert events[2].event["error"]["message"] == "transform fragile:shape raised KeyError"  # never its text
    assert dead["metadata"]["record_pks"] == ["21"] and dead["metadata"]["table_name"] == "orders"
    assert events[1].msg_id == dead["metadata"]["idempotency_key"]
    assert "record" not in dead


def test_enrichment_adds_each_rows_query_result(
    shop: Database, names: TestNames, nats_srv: Nats, stream_cleanup: str, tmp_path: Path
) -> None:
    with shop.connect() as conn:
        conn.execute("INSERT INTO customers (id, name, tenant) VALUES (1, 'Ada', 'acme'), (2, 'Grace', 'globex')")
    sink = {"name": "enriched", "source": {"include_tables": ["public.orders"]}, "enrichment": "with-customer", "partition_count": 1,
            "destination": {"subject_prefix": names.subject_prefix, "stream": {"name": names.stream}}}
    query = ("SELECT o.id, c.name AS customer, c.tenant FROM orders o JOIN customers c ON c.id = o.customer_id "
             "WHERE o.id = ANY($1)")
    config = write_config(tmp_path, shop, nats_srv, names, [sink],
                          functions=[{"name": "with-customer", "type": "enrichment", "code": query}])

    def workload(conn: psycopg.Connection[Any]) -> None:
        conn.execute("INSERT INTO orders VALUES (30, 1, 'new', 1, NULL), (31, 2, 'new', 1, NULL), "
                     "(32, 99, 'new', 1, NULL)")

    _run(config, shop, workload)
    got = [(e.event["record"]["id"], e.event["metadata"]["enrichment"]) for e in stored(nats_srv.url, names.stream)]
    assert got == [(30, {"id": 30, "customer": "Ada", "tenant": "acme"}),
                   (31, {"id": 31, "customer": "Grace", "tenant": "globex"}), (32, None)]


def test_toast_policies(
    database: Database, names: TestNames, nats_srv: Nats, stream_cleanup: str, tmp_path: Path
) -> None:
    with database.connect() as conn:
        conn.execute("CREATE TABLE docs (id int PRIMARY KEY, title text, body text)")
        conn.execute("ALTER TABLE docs ALTER COLUMN body SET STORAGE EXTERNAL")  # TOASTed uncompressed
        conn.execute("CREATE TABLE full_docs (id int PRIMARY KEY, title text, body text)")
        conn.execute("ALTER TABLE full_docs ALTER COLUMN body SET STORAGE EXTERNAL")
        conn.execute("ALTER TABLE full_docs REPLICA IDENTITY FULL")
    p = names.subject_prefix
    stream = {"name": names.stream, "subjects": [f"{p}{policy}.>" for policy in ("placeholder", "omit", "old")]}
    sinks = [{"name": policy, "toast": policy,
              "destination": {"subject_prefix": f"{p}{policy}", "stream": stream}}
             for policy in ("placeholder", "omit", "old")]
    config = write_config(tmp_path, database, nats_srv, names, sinks)
    body = "x" * 10_000

    def workload(conn: psycopg.Connection[Any]) -> None:
        for table in ("docs", "full_docs"):
            conn.execute(f"INSERT INTO {table} VALUES (1, 'a', %s)", (body,))
            conn.execute(f"UPDATE {table} SET title = 'b' WHERE id = 1")

    _run(config, database, workload)
    events = stored(nats_srv.url, names.stream)
    updates = {(e.subject.split(".")[0].removeprefix(p), e.subject.split(".")[-2]): e.event["record"]
               for e in events if e.event["action"] == "update"}
    assert updates == {
        ("placeholder", "docs"): {"id": 1, "title": "b", "body": "unchanged_toast"},
        ("placeholder", "full_docs"): {"id": 1, "title": "b", "body": body},
        ("omit", "docs"): {"id": 1, "title": "b"},
        ("omit", "full_docs"): {"id": 1, "title": "b"},
        ("old", "docs"): {"id": 1, "title": "b"},
        ("old", "full_docs"): {"id": 1, "title": "b", "body": body},
    }


def test_a_sequin_file_with_an_elixir_function_says_what_to_write_in_python(
    database: Database, names: TestNames, nats_srv: Nats, tmp_path: Path
) -> None:
    sink = {"name": "sequin", "transform": "my-transform",
            "destination": {"subject_prefix": names.subject_prefix, "stream": {"name": names.stream}}}
    elixir = 'def transform(action, record, changes, metadata) do\n  %{id: record["id"]}\nend'
    config = write_config(tmp_path, database, nats_srv, names, [sink],
                          functions=[{"name": "my-transform", "type": "transform", "code": elixir}])
    done = run_to_exit(config, timeout=60)
    assert fatal_line(done).startswith("walflow: invalid walflow config")
    assert "sinks[0].transform: function 'my-transform' is Elixir code" in done.stderr
    assert "def transform(action, record, changes, metadata)" in done.stderr and "python: module:function" in done.stderr


def test_nothing_masked_leaves_in_clear_through_reads_enrichment_or_dead_letters(
    database: Database, names: TestNames, nats_srv: Nats, stream_cleanup: str, tmp_path: Path
) -> None:
    """A masked key and a masked column, read by a backfill, enriched by a query that selects them
    again, and failing in a filter that sees them in clear: every message checked byte for byte."""
    with database.connect() as conn:
        conn.execute("CREATE TABLE members (email text PRIMARY KEY, phone text, plan text)")
        conn.execute("INSERT INTO members VALUES ('ada.private@example.com', '+44-7700-900123', 'gold'), "
                     "('grace.h@example.com', '+1-555-0100', 'free')")
    _module(tmp_path, "judge", """
        def keep(action, record, changes, metadata):
            if record["plan"] == "broken":
                raise ValueError("cannot judge " + record["email"])
            return True
        """)
    sink: dict[str, Any] = {"name": "members", "initial_backfill": True, "partition_count": 1, "on_error": "dead_letter",
            "filter": {"python": "judge:keep"}, "enrichment": "again",
            "routing": {"subject": "{prefix}.{database}.members.{record.email}", "key_header": "Walflow-Key"},
            "tables": [{"name": "public.members", "columns": {"mask": {"email": "hash", "phone": {"keep_last": 2}}}}],
            "destination": {"subject_prefix": names.subject_prefix, "stream": {"name": names.stream}}}
    query = "SELECT email, phone, upper(plan) AS plan_name FROM members WHERE email = ANY($1)"
    config = write_config(tmp_path, database, nats_srv, names, [sink], mask_secret=SECRET,
                          functions=[{"name": "again", "type": "enrichment", "code": query}])

    def workload(conn: psycopg.Connection[Any]) -> None:
        conn.execute("INSERT INTO members VALUES ('linus.t@example.com', '+358-40-1234567', 'broken')")
        conn.execute("UPDATE members SET plan = 'silver' WHERE email = 'grace.h@example.com'")

    run_workload(config, database, workload,
                 ready=(lambda: len(stored(nats_srv.url, names.stream)) >= 2, "the backfill's reads"))
    events = stored(nats_srv.url, names.stream)
    clear = [b"ada.private@example.com", b"grace.h@example.com", b"linus.t@example.com", b"7700-900123",
             b"555-0100", b"40-1234567"]
    for e in events:
        raw = _raw(e) + base64.b64decode(e.msg_id)
        for value in clear:
            assert value not in raw, (value, e)
    by_action = sorted((e.event.get("action"), "error" in e.event) for e in events)
    assert by_action == [("insert", True), ("read", False), ("read", False), ("update", False)]
    reads = [e for e in events if e.event.get("action") == "read"]
    assert {e.event["record"]["email"] for e in reads} == {_hash("ada.private@example.com"),
                                                          _hash("grace.h@example.com")}
    assert all(e.event["metadata"]["enrichment"]["email"] == e.event["record"]["email"] for e in reads)
    assert {e.event["metadata"]["enrichment"]["plan_name"] for e in reads} == {"GOLD", "FREE"}
    dead = next(e for e in events if "error" in e.event)
    assert dead.event["error"]["message"] == "ValueError"
    assert dead.event["metadata"]["record_pks"] == [_hash("linus.t@example.com")]
