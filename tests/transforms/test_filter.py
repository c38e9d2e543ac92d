"""Which changes a sink receives: actions, schema and table rules, legacy ``table``; truncates never."""

from __future__ import annotations

import logging
import sys
import threading
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from core.events import Action, ReadOf
from core.metrics import Metrics
from tests.transforms.samples import make_sink, raw_change
from transforms.filter import SinkFilter


@pytest.mark.parametrize("action", ["insert", "update", "delete"])
def test_default_sink_receives_every_row_change_of_every_table(action: Action) -> None:
    accept = SinkFilter(make_sink())
    assert accept(raw_change(action, old={"id": b"7"}))
    assert accept(raw_change(action, schema="other", table="anything", old={"id": b"7"}))


@pytest.mark.parametrize(
    ("fields", "schema", "table", "action", "passes"),
    [
        ({"actions": ["insert"]}, "public", "orders", "insert", True),
        ({"actions": ["insert"]}, "public", "orders", "update", False),
        ({"actions": ["insert"]}, "public", "orders", "delete", False),
        ({"actions": ["update", "delete"]}, "public", "orders", "delete", True),
        ({"source": {"include_schemas": ["public"]}}, "public", "orders", "insert", True),
        ({"source": {"include_schemas": ["public"]}}, "app", "orders", "insert", False),
        ({"source": {"include_schemas": []}}, "public", "orders", "insert", False),  # empty list: nothing
        ({"source": {"exclude_schemas": ["audit"]}}, "audit", "log", "insert", False),
        ({"source": {"exclude_schemas": ["audit"]}}, "public", "log", "insert", True),
        ({"source": {"include_tables": ["public.orders"]}}, "public", "orders", "insert", True),
        ({"source": {"include_tables": ["public.orders"]}}, "public", "items", "insert", False),
        ({"source": {"include_tables": ["public.orders"]}}, "app", "orders", "insert", False),
        ({"source": {"exclude_tables": ["public.json_web_tokens"]}}, "public", "json_web_tokens", "insert", False),
        ({"source": {"exclude_tables": ["public.json_web_tokens"]}}, "app", "json_web_tokens", "insert", True),
        ({"source": {"include_tables": ["public.Orders"]}}, "public", "orders", "insert", False),  # exact names
        ({"table": "public.orders"}, "public", "orders", "update", True),
        ({"table": "public.orders"}, "public", "items", "update", False),
        # every condition must hold
        ({"source": {"include_schemas": ["public"], "exclude_tables": ["public.secret"]}}, "public", "secret",
         "insert", False),
        ({"source": {"include_schemas": ["public"], "exclude_tables": ["public.secret"]}}, "public", "orders",
         "insert", True),
        ({"source": {"include_tables": ["public.orders"], "exclude_schemas": ["public"]}}, "public", "orders",
         "insert", False),
        ({"source": {"include_tables": ["public.orders"], "exclude_tables": ["public.orders"]}}, "public",
         "orders", "insert", False),
        ({"table": "public.orders", "source": {"include_tables": ["public.items"]}}, "public", "orders", "insert",
         False),
        ({"table": "public.orders", "source": {"include_schemas": ["app"]}}, "public", "orders", "insert", False),
        ({"table": "public.orders", "actions": ["delete"]}, "public", "orders", "insert", False),
        ({"table": "public.orders", "actions": ["delete"]}, "public", "orders", "delete", True),
    ],
)
def test_filter_rules(fields: dict[str, Any], schema: str, table: str, action: Action, passes: bool) -> None:
    change = raw_change(action, schema=schema, table=table, old={"id": b"7"})
    accept = SinkFilter(make_sink(**fields))
    assert accept(change) is passes
    assert accept(change) is passes  # and again, from the per-table cache


SCHEMAS = ["public", "app", "a.b"]
TABLES = ["orders", "secret", "c"]
QUALIFIED = [f"{s}.{t}" for s in SCHEMAS for t in TABLES]


def _maybe_subset(names: list[str]) -> st.SearchStrategy[list[str] | None]:
    return st.none() | st.lists(st.sampled_from(names), unique=True)


@given(
    actions=st.lists(st.sampled_from(["insert", "update", "delete"]), min_size=1, unique=True),
    include_schemas=_maybe_subset(SCHEMAS),
    exclude_schemas=_maybe_subset(SCHEMAS),
    include_tables=_maybe_subset(QUALIFIED),
    exclude_tables=_maybe_subset(QUALIFIED),
    legacy=st.none() | st.sampled_from(QUALIFIED),
    changes=st.lists(
        st.tuples(st.sampled_from(["insert", "update", "delete", "truncate"]), st.sampled_from(SCHEMAS),
                  st.sampled_from(TABLES)),
        min_size=1, max_size=12,
    ),
)
def test_filter_is_the_conjunction_of_its_rules(
    actions: list[str],
    include_schemas: list[str] | None,
    exclude_schemas: list[str] | None,
    include_tables: list[str] | None,
    exclude_tables: list[str] | None,
    legacy: str | None,
    changes: list[tuple[Action, str, str]],
) -> None:
    """Any combination: a change passes exactly when every rule admits it (truncates: never)."""
    source = {"include_schemas": include_schemas, "exclude_schemas": exclude_schemas,
              "include_tables": include_tables, "exclude_tables": exclude_tables}
    accept = SinkFilter(make_sink(actions=actions, source=source, table=legacy))
    for action, schema, table in changes:
        name = f"{schema}.{table}"
        expected = (
            action in actions
            and (include_schemas is None or schema in include_schemas)
            and schema not in (exclude_schemas or [])
            and (include_tables is None or name in include_tables)
            and name not in (exclude_tables or [])
            and (legacy is None or name == legacy)
        )
        assert accept(raw_change(action, schema=schema, table=table, old={"id": b"1"})) is expected


def test_truncate_never_passes_and_warns_once_per_table(caplog: pytest.LogCaptureFixture) -> None:
    accept = SinkFilter(make_sink(name="audit", source={"exclude_tables": ["public.skipped"]}))
    with caplog.at_level(logging.WARNING, logger="walflow.transforms.filter"):
        results = [
            accept(raw_change("truncate", table="orders")),
            accept(raw_change("truncate", table="orders")),
            accept(raw_change("truncate", table="items")),
            accept(raw_change("truncate", table="skipped")),  # not this sink's table: no noise
            accept(raw_change("truncate", table="orders")),
        ]
    assert results == [False] * 5
    assert [r.getMessage() for r in caplog.records] == [
        "TRUNCATE of public.orders is not delivered to sink audit: walflow delivers row changes only",
        "TRUNCATE of public.items is not delivered to sink audit: walflow delivers row changes only",
    ]
    assert all(r.levelno == logging.WARNING for r in caplog.records)


def test_tables_first_seen_later_pass_by_the_same_rules() -> None:
    """A table added to the publication while walflow runs needs no restart."""
    accept = SinkFilter(make_sink(source={"include_schemas": ["public"], "exclude_tables": ["public.secret"]}))
    assert accept(raw_change(table="orders"))
    assert accept(raw_change(table="created_later"))
    assert not accept(raw_change(schema="later_schema", table="created_later"))
    assert not accept(raw_change(table="secret"))


def test_one_decision_per_table_however_many_versions_come_by() -> None:
    accept = SinkFilter(make_sink())
    assert all(accept(raw_change()) for _ in range(50))
    assert len(accept._tables) == 1


def test_a_batch_keeps_its_order_and_counts_what_it_drops_from_the_slot() -> None:
    metrics = Metrics()
    select = SinkFilter(make_sink(name="audit", actions=["insert", "delete"]), metrics).select
    mine, theirs = ReadOf("audit", "b1", '["1"]'), ReadOf("other", "b2", '["1"]')
    batch = [
        raw_change("insert", idx=0),
        raw_change("update", idx=1),
        raw_change("delete", idx=2, old={"id": b"7"}),
        raw_change("update", table="items", idx=3),
        raw_change("truncate", idx=4),
        raw_change("insert", idx=5)._replace(action="read", read=mine),
        raw_change("insert", idx=6)._replace(action="read", read=theirs),  # another sink's: not dropped from the slot
    ]
    assert [c.commit_idx for c in select(batch)] == [0, 2, 5]
    select(batch[1:2])
    counted = {
        (s.labels["sink"], s.labels["table"], s.labels["action"]): s.value
        for family in text_string_to_metric_families(metrics.exposition().decode())
        for s in family.samples if s.name == "walflow_changes_filtered_total"
    }
    assert counted == {("audit", "public.orders", "update"): 2, ("audit", "public.items", "update"): 1,
                       ("audit", "public.orders", "truncate"): 1}


def test_another_databases_worker_never_touches_the_sinks_counts() -> None:
    """Two databases on two worker threads of one process share each sink's filter: the
    worker of the other database must not flush the counts the sink's own worker is
    filling (that raised "dictionary changed size during iteration" and over-counted)."""
    metrics = Metrics()
    accept = SinkFilter(make_sink(actions=["insert"]), metrics)
    mine = [raw_change("update", table=f"t{i}") for i in range(500)]  # dropped, counted per table
    theirs = [raw_change("insert", database="other") for _ in range(10)]
    errors: list[BaseException] = []
    done = threading.Event()

    def other_worker() -> None:
        try:
            while not done.is_set():
                assert accept.select(theirs) == []
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    thread = threading.Thread(target=other_worker)
    thread.start()
    try:
        for _ in range(200):
            accept.select(mine)
    finally:
        done.set()
        thread.join()
        sys.setswitchinterval(interval)
    assert errors == []
    counted = sum(s.value for m in metrics.changes_filtered.collect() for s in m.samples if s.name.endswith("_total"))
    assert counted == 200 * len(mine)


def test_a_read_of_a_table_the_sink_does_not_read_is_dropped_like_its_changes() -> None:
    """A backfill request for an excluded table is refused where it is acted on; its reads
    would be dropped here too (a request is anyone's to write)."""
    sink = make_sink(source={"exclude_tables": ["public.json_web_tokens"]})
    accept = SinkFilter(sink)
    mine = ReadOf("app-to-nats", "b1", '["1"]')
    assert accept(raw_change("insert", table="orders")._replace(action="read", read=mine))
    assert not accept(raw_change("insert", table="json_web_tokens")._replace(action="read", read=mine))
    assert not sink.reads("public", "public.json_web_tokens") and sink.reads("public", "public.orders")
