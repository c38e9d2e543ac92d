"""Values are input (issue 23), through the real pipeline (``python -m bytewax.run dataflows.cdc``):
a json or jsonb document of any depth Postgres accepts is published as that JSON; transaction
annotations as deep and as broken, and a filter that fails quoting the row, while ordinary
changes flow. Each lands exactly once as its policy says, the flow goes on, the slot passes
them all, and a canary value written where only a failure could carry it is in no stored byte
and no line of the pipeline's log. (Unit tests: tests/connectors/postgres/test_types.py,
tests/connectors/postgres/test_json.py, tests/transforms/test_json_text.py.)"""

from __future__ import annotations

import base64
import collections
import json
import textwrap
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.harness import Database, Nats, TestNames
from tests.pipeline import Stored, any_depth, loads_any_depth, run_workload, stored, write_config

pytestmark = pytest.mark.slow


def _deep(levels: int) -> str:
    return "[" * levels + '{"k": null}' + "]" * levels


def test_json_nested_deeper_than_any_parser_is_published_as_that_json(
    database: Database, names: TestNames, nats_srv: Nats, stream_cleanup: str, tmp_path: Path
) -> None:
    with database.connect() as conn:
        conn.execute("CREATE TABLE docs (id int PRIMARY KEY, b jsonb, j json)")
        conn.execute(f"CREATE PUBLICATION {names.publication} FOR TABLE docs")
    sink = {"name": "g", "destination": {"subject_prefix": names.subject_prefix, "stream": {"name": names.stream}}}
    config = write_config(tmp_path, database, nats_srv, names, [sink])
    depths = [1, 240, 241, 300, 1500, 5000]

    def workload(conn: object) -> None:
        for i, levels in enumerate(depths, 1):
            conn.execute("INSERT INTO docs VALUES (%s, %s::jsonb, %s::json)",  # type: ignore[attr-defined]
                         [i, _deep(levels), _deep(levels).replace("[", "[ ", 3)])
        conn.execute("INSERT INTO docs VALUES (99, '{}', '{}')")  # type: ignore[attr-defined]

    run_workload(config, database, workload)
    with any_depth():  # the test's own parser, to read back what walflow published
        events = sorted(stored(nats_srv.url, names.stream), key=lambda e: e.event["record"]["id"])
    assert [e.event["record"]["id"] for e in events] == [1, 2, 3, 4, 5, 6, 99]  # each once (rows keep no order)
    with database.connect() as conn:
        texts = {int(str(i)): str(t) for i, t in conn.execute("SELECT id, b::text FROM docs").fetchall()}
    for event, levels in zip(events, depths, strict=False):
        text = texts[event.event["record"]["id"]].encode()
        if levels > 240:  # too deep to load: Postgres's own text, spliced in as it is
            assert b'"b":' + text + b',"j":' + _deep(levels).replace("[", "[ ", 3).encode() in event.data
        else:
            assert json.loads(event.data)["record"]["b"] == json.loads(text)


CANARY = "canary-5d1f0c"
#: A jsonb of ``n`` levels (arrays around an object), and a json as written: spaces and a duplicate key.
JSONB = "(repeat('[', {n} - 1) || '{{\"k\": \"v\"}}' || repeat(']', {n} - 1))::jsonb"
JSON = "(repeat('[ ', {n} - 1) || '{{\"a\" : 1, \"a\": 2}}' || repeat(' ]', {n} - 1))::json"


@pytest.fixture
def tables(database: Database) -> Database:
    with database.connect() as conn:
        conn.execute("CREATE TABLE docs (id int PRIMARY KEY, doc jsonb, raw json)")
        conn.execute("CREATE TABLE orders (id int PRIMARY KEY, note text, secret text)")
        conn.execute(f"INSERT INTO docs VALUES (0, {JSONB.format(n=1500)}, {JSON.format(n=1500)})")  # for the backfill
    return database


def _workload(conn: psycopg.Connection[Any]) -> None:
    for i in range(1, 6):  # ordinary changes before, between and after the untrusted ones
        conn.execute("INSERT INTO orders VALUES (%s, 'ok', 'plain')", (i,))
        conn.execute("INSERT INTO docs VALUES (%s, %s, %s)", (i, json.dumps({"i": i}), f'{{"i": {i}}}'))
    for i, depth in ((10, 300), (11, 1500)):
        conn.execute(f"INSERT INTO docs VALUES (%s, {JSONB.format(n=depth)}, {JSON.format(n=depth)})", (i,))
    conn.execute("INSERT INTO orders VALUES (20, 'judge-me', %s)", (f"the {CANARY} of order 20",))
    with conn.transaction():  # annotations nested 1,500 levels: published as that JSON
        conn.execute("SELECT pg_logical_emit_message(true, 'sequin:transaction_annotations.set', "
                     "repeat('[', 1499) || '{\"user\": \"paul\"}' || repeat(']', 1499))")
        conn.execute("INSERT INTO docs VALUES (30, '{}', '{}')")
    with conn.transaction():  # annotations 1,500 levels deep that are not JSON, the canary inside: null
        conn.execute("SELECT pg_logical_emit_message(true, 'sequin:transaction_annotations.set', "
                     "repeat('[', 1500) || %s || repeat(']', 1499))", (json.dumps(CANARY),))
        conn.execute("INSERT INTO docs VALUES (31, '{}', '{}')")
        conn.execute("INSERT INTO orders VALUES (31, 'ok', 'plain')")
    for i in range(40, 45):
        conn.execute("INSERT INTO orders VALUES (%s, 'ok', 'plain')", (i,))
        conn.execute("INSERT INTO docs VALUES (%s, '[1]', '[1]')", (i,))


def _raw(e: Stored) -> bytes:
    return e.subject.encode() + json.dumps(e.headers).encode() + e.data + base64.b64decode(e.msg_id)


def test_untrusted_values_land_as_their_policy_says_and_the_flow_goes_on(
    tables: Database, names: TestNames, nats_srv: Nats, stream_cleanup: str, tmp_path: Path
) -> None:
    (tmp_path / "judge.py").write_text(textwrap.dedent("""
        def keep(action, record, changes, metadata):
            if record["note"] == "judge-me":
                raise ValueError("cannot judge " + record["secret"])
            return True
        """))
    p = names.subject_prefix
    stream = {"name": names.stream, "subjects": [f"{p}docs.>", f"{p}orders.>"]}
    sinks: list[dict[str, Any]] = [
        {"name": "docs", "source": {"include_tables": ["public.docs"]}, "initial_backfill": True, "partition_count": 2,
         "destination": {"subject_prefix": f"{p}docs", "stream": stream}},
        {"name": "orders", "source": {"include_tables": ["public.orders"]}, "filter": {"python": "judge:keep"},
         "on_error": "dead_letter", "partition_count": 2, "destination": {"subject_prefix": f"{p}orders", "stream": stream}},
    ]
    config = write_config(tmp_path, tables, nats_srv, names, sinks)
    run_workload(config, tables, _workload,
                 ready=(lambda: any(e.event.get("action") == "read" for e in stored(nats_srv.url, names.stream)),
                        "the backfill's read of the 1,500-level row"))
    events = stored(nats_srv.url, names.stream)
    with tables.connect() as conn:
        texts = {int(str(i)): (str(doc).encode(), str(raw).encode()) for i, doc, raw in conn.execute(
            "SELECT id, doc::text, raw::text FROM docs").fetchall()}

    # exactly once, everything: the backfill's read, every insert, the dead letter in its row's place
    landed = collections.Counter(
        (e.subject.split(".")[0], e.event["metadata"]["record_pks"][0], e.event.get("action")) for e in events)
    docs = {(f"{p}docs", str(i), "insert") for i in texts} - {(f"{p}docs", "0", "insert")} | {(f"{p}docs", "0", "read")}
    orders = {(f"{p}orders", str(i), "insert") for i in (*range(1, 6), 20, 31, *range(40, 45))}
    assert set(landed) == docs | orders and set(landed.values()) == {1}
    assert len({e.msg_id for e in events}) == len(events)

    # deep json and jsonb: Postgres's own text, embedded as it is, parsed back as that JSON
    by_id = {int(e.event["record"]["id"]): e for e in events if e.subject.startswith(f"{p}docs.")}
    for i in (0, 10, 11):
        doc, raw = texts[i]
        assert b'"doc":' + doc + b',"raw":' + raw + b"}" in by_id[i].data, i  # json: its spaces and both "a"
        with any_depth():
            assert by_id[i].event["record"]["doc"] == loads_any_depth(doc)
            assert by_id[i].event["record"]["raw"] == loads_any_depth(raw)
    assert by_id[3].event["record"] == {"id": 3, "doc": {"i": 3}, "raw": {"i": 3}}  # ordinary ones as ever

    # annotations: the deep JSON as it is; the broken ones null, on both sinks
    annotations = b"[" * 1499 + b'{"user": "paul"}' + b"]" * 1499
    assert b'"transaction_annotations":' + annotations + b',"enrichment"' in by_id[30].data
    assert by_id[31].event["metadata"]["transaction_annotations"] is None
    judged = {e.event["metadata"]["record_pks"][0]: e.event for e in events if e.subject.startswith(f"{p}orders.")}
    assert judged["31"]["metadata"]["transaction_annotations"] is None and judged["31"]["record"]["id"] == 31

    # the failing filter: a dead letter with the step, position and key, the exception's type only
    assert judged["20"]["error"] == {"step": "filter judge:keep", "message": "ValueError"}
    assert "record" not in judged["20"] and judged["20"]["metadata"]["commit_lsn"] > 0

    # the canary: in no stored byte, in no log line
    for e in events:
        assert CANARY.encode() not in _raw(e), e.subject
    log = (tmp_path / "walflow.log").read_text(errors="replace")
    assert CANARY not in log
    assert "transaction annotations that are not JSON are published as null" in log
