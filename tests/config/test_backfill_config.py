"""``initial_backfill`` in Sequin's forms, and ``walflow.backfill``."""

from __future__ import annotations

import pytest

from config import parse_config
from config.schema import InitialBackfill
from tests.config.test_schema import MINIMAL, errors_of


def _sink(extra: str) -> str:
    return MINIMAL.replace("    database: app\n    destination", f"    database: app\n{extra}    destination")


def test_initial_backfill_true_and_per_table_lists() -> None:
    assert parse_config(MINIMAL, env={}).sinks[0].initial_backfill is False
    assert parse_config(_sink("    initial_backfill: true\n"), env={}).sinks[0].initial_backfill is True
    text = _sink(
        "    initial_backfill:\n"
        "      - table: public.users\n"
        "      - table: public.orders\n"
        "        type: partial\n"
        "        sort_column: updated_at\n"
        "        start_position: 2025-01-01T00:00:00Z\n"  # YAML reads a timestamp: Postgres gets its text
        "      - { table: public.events, type: partial, sort_column: id, start_position: 100 }\n"
    )
    assert parse_config(text, env={}).sinks[0].initial_backfill == [
        InitialBackfill(table="public.users"),
        InitialBackfill(table="public.orders", type="partial", sort_column="updated_at",
                        start_position="2025-01-01 00:00:00+00:00"),
        InitialBackfill(table="public.events", type="partial", sort_column="id", start_position="100"),
    ]


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        ("{ table: .users }", "sinks[0].initial_backfill[0].table: '.users' is not a table name"),
        ("{ table: public.users, type: partial }", "sinks[0].initial_backfill[0]: a partial backfill "
                                                    "needs sort_column and start_position"),
        ("{ table: public.users, sort_column: id }", "sinks[0].initial_backfill[0]: sort_column and "
                                                     "start_position belong to type: partial"),
        ("{ table: public.users, type: half }", "sinks[0].initial_backfill[0].type: Input should be 'full' or 'partial'"),
    ],
)
def test_initial_backfill_errors_name_the_entry(entry: str, expected: str) -> None:
    problems = errors_of(_sink(f"    initial_backfill: [{entry}]\n"))
    assert any(p.startswith(expected) for p in problems), problems


def test_backfill_settings() -> None:
    config = parse_config(MINIMAL + "walflow:\n  backfill: { max_concurrent: 4, query_budget_ms: 500 }\n", env={})
    assert config.walflow.backfill.max_concurrent == 4 and config.walflow.backfill.query_budget_ms == 500
    assert errors_of(MINIMAL + "walflow:\n  backfill: { max_concurrent: 0 }\n") == [
        "walflow.backfill.max_concurrent: Input should be greater than or equal to 1 (got 0)"]


def test_an_unknown_key_in_an_entry_is_named_with_the_known_ones() -> None:
    assert errors_of(_sink("    initial_backfill: [{ tabel: public.users }]\n")) == [
        "sinks[0].initial_backfill[0].table: required key is missing",
        "sinks[0].initial_backfill[0].tabel: unknown key (did you mean 'table'?); expected one of: sort_column, "
        "start_position, table, type",
    ]
