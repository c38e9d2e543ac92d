"""A sink partition's shaped path without servers: what may reach a message when a step fails
or a key column is masked (nothing in clear), and the errors a plan raises for a config that
cannot fit its table (fatal whatever ``on_error`` says)."""

from __future__ import annotations

import base64
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from config.schema import SinkConfig
from core.errors import FatalError
from core.events import Message, ReadOf
from core.wire import DESCRIBE, pack
from tests.transforms.samples import make_database, make_sink
from tests.transforms.test_dispatch import change, typed_table
from transforms.render import Render
from transforms.shape import Shaping

SECRET = "s3cret"
STREAM = ("wf.>",)


def _render(sink: SinkConfig, tmp_path: Path | None = None) -> Render:
    db = make_database()
    return Render(sink, db, Shaping(sink, db, 0, tmp_path, SECRET, STREAM))


def _messages(render: Render, *changes: Any) -> list[Message]:
    table = changes[0].table
    return render([[(DESCRIBE, table), *(pack(c) for c in changes)]])


def _sink(**fields: Any) -> SinkConfig:
    return make_sink(destination={"type": "nats", "host": "localhost", "subject_prefix": "wf"}, **fields)


@pytest.fixture
def module(tmp_path: Path) -> Any:
    def write(name: str, source: str) -> None:
        (tmp_path / f"{name}.py").write_text(source)
        sys.modules.pop(name, None)
    return write


def test_a_failing_filter_on_a_masked_table_says_its_type_only(tmp_path: Path, module: Any) -> None:
    module("leaky", "def keep(action, record, changes, metadata):\n    raise ValueError(record['status'])\n")
    sink = _sink(filter={"python": "leaky:keep"}, on_error="dead_letter",
                 tables=[{"name": "public.orders", "columns": {"mask": {"status": "redact"}}}])
    (message,) = _messages(_render(sink, tmp_path), change(typed_table(), 7))
    dead = json.loads(message.payload)
    assert dead["error"] == {"step": "filter leaky:keep", "message": "ValueError"}
    assert b"paid" not in message.payload and message.subject == b"wf.app.dead_letter"


def test_a_failing_filter_says_its_type_only_on_any_table(tmp_path: Path, module: Any) -> None:
    """A dead letter never carries an exception's text: it may quote the row, mask or no mask."""
    module("leaky2", "def keep(action, record, changes, metadata):\n    raise ValueError(record['status'])\n")
    sink = _sink(filter={"python": "leaky2:keep"}, on_error="dead_letter")
    (message,) = _messages(_render(sink, tmp_path), change(typed_table(), 7))
    assert json.loads(message.payload)["error"] == {"step": "filter leaky2:keep", "message": "ValueError"}
    assert b"paid" not in message.payload


def test_a_filter_returning_a_value_on_a_masked_table_does_not_quote_it(tmp_path: Path, module: Any) -> None:
    module("quoting", "def keep(action, record, changes, metadata):\n    return record['status']\n")
    sink = _sink(filter={"python": "quoting:keep"}, on_error="dead_letter",
                 tables=[{"name": "public.orders", "columns": {"mask": {"status": "hash"}}}])
    (message,) = _messages(_render(sink, tmp_path), change(typed_table(), 7))
    assert json.loads(message.payload)["error"]["message"] == "returned str, not True or False"


def test_stop_names_the_rows_position_and_key(tmp_path: Path, module: Any) -> None:
    module("strict", "def keep(action, record, changes, metadata):\n    raise KeyError(record['status'])\n")
    render = _render(_sink(filter={"python": "strict:keep"}), tmp_path)
    with pytest.raises(FatalError, match=r"filter strict:keep failed for public.orders insert at commit LSN "
                                         r"0/6B \(commit_idx 0, record_pks \[\"7\"\]\): KeyError\. Nothing at or after "
                                         r"it is confirmed") as info:
        _messages(render, change(typed_table(), 7))
    assert "paid" not in str(info.value)


def test_a_read_of_a_masked_key_names_it_by_a_keyed_hash() -> None:
    sink = _sink(tables=[{"name": "public.orders", "columns": {"mask": {"id": "hash"}}}])
    read = change(typed_table(), 7, "read", read=ReadOf("app-to-nats", "bf1", '["7"]'))
    (message,) = _messages(_render(sink), read)
    named = base64.b64decode(message.msg_id).decode()
    hidden = named.removeprefix("app/app-to-nats/read/bf1/")
    assert len(hidden) == 64 and '["7"]' not in named
    assert hashlib.sha256(b'["7"]').hexdigest() not in named  # keyed: not found by hashing candidate keys
    assert json.loads(message.payload)["metadata"]["record_pks"] != ["7"]


def test_a_template_naming_a_column_the_table_does_not_publish_is_fatal_even_with_dead_letters() -> None:
    sink = _sink(on_error="dead_letter", routing={"subject": "{prefix}.{database}.{record.tenant}"})
    with pytest.raises(FatalError, match=r"sinks\[0\]\.routing\.subject: '\{record\.tenant\}' names no published "
                                         r"column of table public\.orders"):
        _messages(_render(sink), change(typed_table(), 7))


def test_an_unexpected_failure_in_a_step_follows_the_policy_too(tmp_path: Path, module: Any) -> None:
    module("odd", "def keep(action, record, changes, metadata):\n    return True\n")
    sink = _sink(filter={"python": "odd:keep"}, on_error="dead_letter",
                 tables=[{"name": "public.orders", "where": [{"column": "status", "eq": "paid"}]}])
    render = _render(sink, tmp_path)
    broken = change(typed_table(), 7)
    plan = render._shaping.plan(broken.table)  # type: ignore[union-attr]
    assert plan is not None

    def failing(*_: Any) -> bool:
        raise AssertionError("a bug in a step")

    object.__setattr__(plan, "rows", failing)
    table = broken.table
    render._tables[table.uid] = table
    render._plans[table.uid] = plan
    (message,) = render([[pack(broken)]])
    assert json.loads(message.payload)["error"] == {"step": "where", "message": "AssertionError"}


def test_a_tables_entry_the_sink_does_not_read_warns_at_startup(caplog: pytest.LogCaptureFixture) -> None:
    sink = _sink(source={"include_tables": ["public.orders"]},
                 tables=[{"name": "public.ordres", "columns": {"mask": {"status": "redact"}}}])
    with caplog.at_level("WARNING", "walflow.shaping"):
        _render(sink)
    assert [r.getMessage() for r in caplog.records] == [
        "sinks[0].tables[0]: the sink does not read public.ordres (its source or table rules leave it out): its "
        "settings apply to nothing"]


def test_filters_and_routing_alone_keep_the_envelopes_own_payload() -> None:
    sink = _sink(routing={"subject": "{prefix}.{database}.{table}.{record.status}", "key_header": "Wf-Key"},
                 tables=[{"name": "public.orders", "where": [{"column": "status", "eq": "paid"}]}])
    kept = change(typed_table(), 7)
    (message,) = _messages(_render(sink), kept)
    unshaped = Render(sink, make_database())([[(DESCRIBE, kept.table), pack(kept)]])[0]
    assert message[:6] == unshaped[:6]
    assert (message.subject, message.headers) == (b"wf.app.orders.paid", b'Wf-Key: ["7"]\r\n')


def test_a_tables_routing_replaces_the_sinks() -> None:
    sink = _sink(routing={"subject": "{prefix}.{database}.all.{action}"},
                 tables=[{"name": "public.orders", "routing": {"subject": "{prefix}.{database}.orders.{record.id}"}}])
    (message,) = _messages(_render(sink), change(typed_table(), 7))
    assert message.subject == b"wf.app.orders.7"
    other = typed_table(relid=2)
    other = type(other)("public", "refunds", other.columns, other.key_columns, other.identity_columns, other.loaders,
                        other.database, other.relid, other.rebuild, other.types)
    (message,) = _messages(_render(sink), change(other, 8))
    assert message.subject == b"wf.app.all.insert"
