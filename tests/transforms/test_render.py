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
from core.events import RawChange, RawRow, ReadOf, Table
from core.message import Message
from core.metrics import Metrics
from core.wire import DESCRIBE, pack
from tests.transforms.samples import ROOM, TS, make_render, make_sink
from tests.transforms.test_dispatch import change, typed_table
from transforms.render import Render

SECRET = "s3cret"


def _render(sink: SinkConfig, tmp_path: Path | None = None, **keys: Any) -> Render:
    return make_render(sink, beside=tmp_path, secret=SECRET, **keys)


def _messages(render: Render, *changes: Any, room: int = ROOM) -> list[Message]:
    table = changes[0].table
    return render([[(DESCRIBE, table), *(pack(c) for c in changes)]], room)


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
    plan = render._shaping.plan(broken.table)
    assert plan is not None

    def failing(*_: Any) -> bool:
        raise AssertionError("a bug in a step")

    assert plan.rows is not None
    plan.rows._checks = (failing,)  # a condition with a bug in it
    table = broken.table
    render._tables[table.uid] = table
    render._plans[table.uid] = plan
    (message,) = render([[pack(broken)]], ROOM)
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
    unshaped = make_render(sink)([[(DESCRIBE, kept.table), pack(kept)]], ROOM)[0]
    assert (message.payload, message.msg_id, message.labels, message.commit_ts) == (
        unshaped.payload, unshaped.msg_id, unshaped.labels, unshaped.commit_ts)
    assert (message.subject, message.headers) == (b"wf.app.orders.paid", b'Wf-Key: ["7"]\r\n')


def test_a_shaped_message_carries_its_commit_time_as_an_unshaped_one_a_read_none() -> None:
    """What latency is measured from (``Message.commit_ts``): the commit, in Unix seconds, however shaped."""
    sink = _sink(tables=[{"name": "public.orders", "columns": {"mask": {"status": "redact"}}}])
    table = typed_table()
    shaped, read = _messages(_render(sink), change(table, 7),
                             change(table, 8, "read", read=ReadOf("app-to-nats", "bf1", '["8"]')))
    assert b'"status":"[redacted]"' in shaped.payload
    assert shaped.commit_ts == TS.timestamp() and shaped.commit_ts > 0
    assert read.commit_ts == 0.0


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


# -- a message larger than the server's max_payload (core/sizes.py) -------------------------------------------


def _row(table: Table, row_id: int, status: bytes, doc: bytes = b'{"a": 1}', old: RawRow | None = None) -> RawChange:
    new = (str(row_id).encode(), status, b"12.50", b"2026-11-30 04:00:00+00", doc)
    return RawChange("update" if old else "insert", table, new, old, False, 100 + row_id, 0, TS, 9)


def _fits(message: Message, room: int) -> bool:
    return len(message.payload) + len(message.msg_id) + len(message.headers) <= room


def test_a_message_over_max_payload_is_published_with_its_largest_values_replaced(
        caplog: pytest.LogCaptureFixture) -> None:
    table, metrics, room = typed_table(), Metrics(), 4000
    big, other = b"s" * 5000, b'{"a": "' + b"d" * 3000 + b'"}'
    render = make_render(_sink(), metrics=metrics)
    small, fitted, again = _messages(render, _row(table, 1, b"paid"), _row(table, 2, big, other),
                                     _row(table, 3, big), room=room)
    assert json.loads(small.payload)["record"]["status"] == "paid"  # under the limit: as it was
    for message, doc in ((fitted, {"a": "d" * 3000}), (again, {"a": 1})):
        record = json.loads(message.payload)["record"]
        assert record == {"id": int(message.msg_id and record["id"]), "status": "__walflow_oversized_value:5000",
                          "amount": "12.50", "at": "2026-11-30T04:00:00.000000Z", "doc": doc}
        assert _fits(message, room)
    assert [r.getMessage().split(":")[0] for r in caplog.records if r.name == "walflow.sizes"] == ["public.orders.status"]
    assert metrics.registry.get_sample_value("walflow_oversized_values_total", {
        "limit": "max_payload", "table": "public.orders", "column": "status"}) == 2


def test_a_message_exactly_at_max_payload_is_published_whole() -> None:
    table = typed_table()
    (whole,) = _messages(make_render(_sink()), _row(table, 1, b"s" * 5000))
    room = len(whole.payload) + len(whole.msg_id)
    assert _messages(make_render(_sink()), _row(table, 1, b"s" * 5000), room=room) == [whole]
    (fitted,) = _messages(make_render(_sink()), _row(table, 1, b"s" * 5000), room=room - 1)
    assert b"__walflow_oversized_value:5000" in fitted.payload


def test_a_read_is_measured_with_its_id_which_names_its_row() -> None:
    """A change's id is short and bounded, so its payload alone is checked first; a read's id holds
    its row's key, of any length: a read over the limit only by its id is fitted too."""
    table = typed_table()
    key = "k" * 3000
    read = _row(table, 1, b"s" * 2000)._replace(action="read", read=ReadOf("app-to-nats", "b1", key))
    (whole,) = _messages(make_render(_sink()), read)
    room = len(whole.payload) + len(whole.msg_id) - 1  # the id is most of the message: ~4 kB of base64
    (fitted,) = _messages(make_render(_sink()), read, room=room)
    assert json.loads(fitted.payload)["record"]["status"] == "__walflow_oversized_value:2000"
    assert fitted.msg_id == whole.msg_id and _fits(fitted, room)


def test_values_whose_json_outgrows_their_text_take_another_round() -> None:
    """A control character is one byte of text and six of JSON (\\u0001): replacing the largest
    text first leaves the message too large, so the next largest goes too."""
    table, room = typed_table(), 3000
    # a text column may hold control characters; a jsonb's text never does (Postgres escapes them)
    status, doc = b"\x01" * 1500, b'{"a": "' + b"s" * 2000 + b'"}'
    (message,) = _messages(make_render(_sink()), _row(table, 1, status, doc), room=room)
    record = json.loads(message.payload)["record"]
    assert (record["status"], record["doc"]) == ("__walflow_oversized_value:1500", "__walflow_oversized_value:2009")
    assert _fits(message, room)


def test_an_update_loses_its_old_values_as_well_and_filters_are_not_asked_again() -> None:
    """The row passed the filters as it is; a condition on a marker would be unknown (false)."""
    table, room = typed_table(), 3000
    sink = _sink(tables=[{"name": "public.orders", "where": [{"column": "status", "ne": "x"}],
                          "columns": {"mask": {"amount": "redact"}}}])
    old = (b"1", b"o" * 4000, b"1.00", b"2026-11-30 04:00:00+00", b"{}")
    (message,) = _messages(make_render(sink), _row(table, 1, b"n" * 4000, old=old), room=room)
    payload = json.loads(message.payload)
    assert payload["record"]["status"] == "__walflow_oversized_value:4000" and payload["record"]["amount"] == "[redacted]"
    assert payload["changes"]["status"] == "__walflow_oversized_value:4000" and _fits(message, room)


def test_a_message_that_cannot_fit_is_its_dead_letter_whatever_on_error_says(
        caplog: pytest.LogCaptureFixture) -> None:
    table, metrics = typed_table(), Metrics()
    render = make_render(_sink(), metrics=metrics)  # on_error: stop
    first, second = _messages(render, _row(table, 1, b"s" * 5000), _row(table, 2, b"s" * 5000), room=600)
    dead = json.loads(first.payload)
    assert first.subject == b"wf.app.dead_letter" and dead["error"]["step"] == "size"
    assert dead["metadata"]["record_pks"] == ["1"] and first.msg_id == _messages(make_render(_sink()),
                                                                          _row(table, 1, b"x"))[0].msg_id  # under the row's own id
    assert b"sssss" not in first.payload and second.subject == b"wf.app.dead_letter"
    assert [r.getMessage() for r in caplog.records if "dead letter" in r.getMessage()] == [
        "public.orders: the insert at commit LSN 0/65 (commit_idx 0) does not fit in sink 'app-to-nats''s "
        "max_payload even with every value but its key's replaced: published as a dead letter "
        '(walflow_dead_letters_total{step="size"}); later ones of this table are not logged']
    assert metrics.registry.get_sample_value("walflow_dead_letters_total", {
        "sink": "app-to-nats", "table": "public.orders", "step": "size"}) == 2
