"""Values are input: a json or jsonb document of any depth Postgres accepts is published as
that JSON, and the flow goes on (issue 23; unit tests in tests/connectors/postgres/test_types.py
and tests/transforms/test_envelope.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.harness import Database, Nats, TestNames
from tests.pipeline import run_workload, stored, write_config

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
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 20_000))  # the test's own parser, to read back what walflow published
    try:
        events = sorted(stored(nats_srv.url, names.stream), key=lambda e: e.event["record"]["id"])
    finally:
        sys.setrecursionlimit(limit)
    assert [e.event["record"]["id"] for e in events] == [1, 2, 3, 4, 5, 6, 99]  # each once (rows keep no order)
    with database.connect() as conn:
        texts = {int(str(i)): str(t) for i, t in conn.execute("SELECT id, b::text FROM docs").fetchall()}
    for event, levels in zip(events, depths, strict=False):
        text = texts[event.event["record"]["id"]].encode()
        if levels > 240:  # too deep to load: Postgres's own text, spliced in as it is
            assert b'"b":' + text + b',"j":' + _deep(levels).replace("[", "[ ", 3).encode() in event.data
        else:
            assert json.loads(event.data)["record"]["b"] == json.loads(text)
