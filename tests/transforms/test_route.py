"""Routing: templates, functions, validation, headers, dead letters; no servers (the subject grammar
itself: ``tests/core/test_subjects.py``)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any
from uuid import UUID

import pytest
from hypothesis import given
from hypothesis import strategies as st

from config.schema import SinkConfig
from config.shaping import RoutingFunction, SubjectRouting
from core.errors import FatalError, ValueFree
from core.events import UNCHANGED_TOAST, JsonText, Row
from core.tokens import subject_token
from transforms import route
from transforms.route import DEFAULT_SUBJECT, Router, RoutingError, publishes_outside, replay_subjects

#: Any str, lone surrogates included: the rules are total.
any_text = st.text(st.characters(exclude_categories=()))

# -- routing: the router ------------------------------------------------------------------------

STREAM = ("wf.app.>",)


def _sink(msg_id: str = "walflow", **keys: Any) -> SinkConfig:
    return SinkConfig.model_validate({
        "name": "orders-out", "database": "app",
        "destination": {"type": "nats", "host": "localhost", "subject_prefix": "wf", "msg_id": msg_id}, **keys,
    })


def _router(subject: str = DEFAULT_SUBJECT, headers: dict[str, str] | None = None, key_header: str | None = None,
            stream: tuple[str, ...] = STREAM, sink: SinkConfig | None = None) -> Router:
    routing = SubjectRouting(subject=subject, headers=headers or {}, key_header=key_header)
    return Router(routing, None, sink or _sink(), "app", stream, key="sinks[0].routing",
                  dead_letter_key="sinks[0].dead_letter_subject")


def _route(router: Router, record: dict[str, Any] | None = None, metadata: dict[str, Any] | None = None,
           pks: tuple[str, ...] = ("7",), action: str = "insert", table: str = "orders") -> tuple[bytes | None, bytes]:
    return router(action, "public", table, record or {}, None, lambda: metadata or {}, pks)


def _function_router(function: Callable[..., Any], key_header: str | None = None, stream: tuple[str, ...] = STREAM,
                     sink: SinkConfig | None = None) -> Router:
    return Router(RoutingFunction(python="shaping:route", key_header=key_header), function, sink or _sink(), "app",
                  stream, key="sinks[0].routing")


def test_the_default_template_leaves_the_subject_to_the_publisher() -> None:
    assert _route(_router()) == (None, b"")
    assert _route(Router(None, None, _sink(), "app", STREAM)) == (None, b"")
    assert _route(_router(headers={"X-Table": "{table}"})) == (None, b"X-Table: orders\r\n")


def test_a_template_renders_every_value_as_one_escaped_token_and_the_prefix_as_it_is() -> None:
    router = _router("{prefix}.{database}.{sink}.{schema}.{table}.{action}.t-{record.tenant}.{record.region}")
    record = {"tenant": "a.b c", "region": "eu*>%"}
    assert _route(router, record, table="line items") == (
        b"wf.app.orders-out.public.line%20items.insert.t-a%2Eb%20c.eu%2A%3E%25", b"")
    assert _route(router, {"tenant": "", "region": "café"}) == ("wf.app.orders-out.public.orders.insert.t-%.café".encode(), b"")
    assert _route(_router("{prefix}.{database}.{{x}}.{record.t}"), {"t": 1}) == (b"wf.app.{x}.1", b"")


@pytest.mark.parametrize(("value", "text"), [
    ("a", "a"),
    (42, "42"),
    (-7, "-7"),
    (Decimal("12.50"), "12%2E50"),
    (Decimal("1E-8"), "0%2E00000001"),  # positional, as the payload writes numerics
    (UUID("0b6d3a4e-7c1b-4b61-9a43-1e5e1f6f2c11"), "0b6d3a4e-7c1b-4b61-9a43-1e5e1f6f2c11"),
    (True, "true"),
    (False, "false"),
    (2.5, "2%2E5"),
])
def test_values_by_their_text(value: Any, text: str) -> None:
    assert _route(_router("{prefix}.{database}.{record.v}"), {"v": value}) == (f"wf.app.{text}".encode(), b"")


@pytest.mark.parametrize(("value", "error"), [
    (None, r"\{record\.v\} is null: a row without the value cannot be routed"),
    (UNCHANGED_TOAST, r"\{record\.v\} is a TOASTed value the update did not change"),
    ([1, 2], r"\{record\.v\} is a list: only a text, a number, a UUID or a boolean"),  # its kind, not its value
    ({"a": 1}, r"\{record\.v\} is a dict"),
    (datetime(2024, 1, 2, tzinfo=UTC), r"\{record\.v\} is a datetime"),
    (float("nan"), r"\{record\.v\} is a float:"),
    (b"\x00", r"\{record\.v\} is a bytes"),
])
def test_a_value_without_a_text_is_an_error_never_a_default(value: Any, error: str) -> None:
    with pytest.raises(RoutingError, match=r"^sinks\[0\]\.routing\.subject '\{prefix\}\.\{database\}\.\{record\.v\}': "
                                           + error):
        _route(_router("{prefix}.{database}.{record.v}"), {"v": value})


def test_json_paths_reach_into_objects_and_arrays() -> None:
    router = _router("{prefix}.{database}.{record.doc.address.city}.{record.doc.tags.1}")
    record = {"doc": {"address": {"city": "São Paulo"}, "tags": ["a", 7]}}
    assert _route(router, record) == (b"wf.app.S\xc3\xa3o%20Paulo.7", b"")
    with pytest.raises(RoutingError, match=r"\{record\.doc\.address\.city\}: record\.doc\.address has no key "
                                           r"'city'$"):  # a JSON value's keys may be the row's data: not listed
        _route(router, {"doc": {"address": {"town": "x"}, "tags": []}})
    with pytest.raises(RoutingError, match=r"\{record\.doc\.tags\.1\}: record\.doc\.tags is a list, which has no '1'"):
        _route(router, {"doc": {"address": {"city": "x"}, "tags": ["a"]}})
    with pytest.raises(RoutingError, match=r"record\.doc is a str, which has no 'address'"):
        _route(router, {"doc": "{}"})
    with pytest.raises(RoutingError, match=r"record\.doc is a core\.events\.JsonText, which has no 'address'"):
        _route(router, {"doc": JsonText(b"[" * 300 + b"]" * 300)})
    with pytest.raises(RoutingError, match=r"\{record\.doc\.address\.city\}: the published record has no column 'doc' "
                                           r"\(it has id\)"):
        _route(router, {"id": 1})


def test_metadata_is_built_only_when_a_template_asks_and_once_per_message() -> None:
    built: list[int] = []

    def metadata() -> dict[str, Any]:
        built.append(1)
        return {"consumer": {"name": "orders-out"}, "commit_lsn": 99}

    router = _router("{prefix}.{database}.{metadata.consumer.name}.{metadata.commit_lsn}",
                     headers={"X-Lsn": "{metadata.commit_lsn}"})
    assert router("update", "public", "t", {}, {}, metadata, ()) == (b"wf.app.orders-out.99", b"X-Lsn: 99\r\n")
    assert len(built) == 2  # once for the subject, once for the headers: never per placeholder
    _route(_router("{prefix}.{database}.{record.id}"), {"id": 1}, metadata=None)
    assert len(built) == 2


def test_templates_without_row_values_render_once_per_table_and_action() -> None:
    router = _router("{prefix}.{database}.{table}.{action}", headers={"X-Schema": "{schema}"}, key_header="Wf-Key")
    for i in range(5):
        assert _route(router, {"id": i}, pks=(str(i),)) == (
            b"wf.app.orders.insert", b'X-Schema: public\r\nWf-Key: ["%d"]\r\n' % i)
    _route(router, action="delete")
    # one rendering per table and action, kept whole: nothing of it is left to render per row
    shared = router._shared
    assert sorted(shared) == [("public", "orders", "delete"), ("public", "orders", "insert")]
    insert = shared[("public", "orders", "insert")]
    assert (insert.subject, insert.headers, insert.bound, insert.row_headers) == (
        b"wf.app.orders.insert", b"X-Schema: public\r\n", None, ())
    per_row = _router("{prefix}.{database}.{table}.{record.id}")
    assert [_route(per_row, {"id": i})[0] for i in range(3)] == [b"wf.app.orders.0", b"wf.app.orders.1", b"wf.app.orders.2"]
    bound = per_row._shared[("public", "orders", "insert")]
    assert bound.subject is None and bound.bound is not None  # its names bound once, the row's value per row


def test_headers_are_not_escaped_but_hold_no_line_break() -> None:
    router = _router(headers={"X-Tenant": "{record.tenant}", "X-Where": "{database}/{schema}.{table}"})
    assert _route(router, {"tenant": "a.b c*"}, table="my.t") == (None, b"X-Tenant: a.b c*\r\nX-Where: app/public.my.t\r\n")
    with pytest.raises(RoutingError, match=r"^sinks\[0\]\.routing\.headers\.X-Tenant '\{record\.tenant\}' gave a "
                                           r"value holding a line break, which a header cannot hold$"):
        _route(router, {"tenant": "a\r\nNats-Msg-Id: x"})
    with pytest.raises(RoutingError, match="is null"):
        _route(router, {"tenant": None})
    with pytest.raises(RoutingError, match="a line break, which a header cannot hold"):
        _route(_router(headers={"X-Table": "{table}"}), table="evil\ntable")  # a quoted identifier may hold one


def test_the_key_header_is_the_primary_key_as_compact_json() -> None:
    router = _router(key_header="Wf-Key")
    assert _route(router, pks=("7", "a b", "é\n")) == (None, 'Wf-Key: ["7","a b","é\\n"]\r\n'.encode())
    assert _route(router, pks=()) == (None, b"Wf-Key: []\r\n")
    with pytest.raises(FatalError, match=r"^sinks\[0\]\.routing: key_header 'wf-key' is one of headers too"):
        _router(headers={"Wf-Key": "{table}"}, key_header="wf-key")


@pytest.mark.parametrize(("subject", "error"), [
    ("{prefix}.{bogus}", r"holds \{bogus\}, which is no placeholder; placeholders: \{prefix\}, \{database\}, "
                         r"\{schema\}, \{table\}, \{action\}, \{sink\}, \{record\.COLUMN\}, \{record\.COLUMN\.KEY\}, "
                         r"\{metadata\.KEY\}"),
    ("{prefix}.{database}.{record}", r"holds \{record\}, which is no placeholder"),
    ("{prefix}.{database}.{record.a..b}", r"holds \{record\.a\.\.b\}, which is no placeholder"),
    ("{prefix}.{database}.{table:>5}", r"holds \{table:>5\}, which is no placeholder"),
    ("{prefix}.{database}.{table", r"has a lone '\{' at character 20: write '\{\{' for a brace"),
    ("{prefix}.{database}.a}", r"has a lone '\}' at character 21"),
    ("{prefix}.{database}..{table}", r"cannot be published on: it has an empty token"),
    ("{prefix}.{database}.{table}.", r"cannot be published on: it has an empty token"),
    ("{prefix}.{database}.>", r"cannot be published on: it has a wildcard token"),
    ("{prefix}.{database}.*.{table}", r"cannot be published on: it has a wildcard token"),
    ("{prefix}.{database}.a b.{table}", r"cannot be published on: it holds whitespace"),
    ("$JS.API.{table}", r"cannot be published on: subjects starting with '\$' are NATS's own"),
    ("{prefix}.{database}.dead", r"^sinks\[0\]\.routing\.subject: '\{prefix\}\.\{database\}\.dead' cannot"),
    ("{prefix}.elsewhere", r"cannot be published on: the sink's stream does not capture it \(its subjects: "
                           r"wf\.app\.>\), so JetStream would never store it"),
])
def test_a_template_no_message_could_use_is_refused_when_the_router_is_built(subject: str, error: str) -> None:
    stream = STREAM if "dead" not in subject else ("wf.app.*.>",)
    with pytest.raises(FatalError, match=error):
        _router(subject, stream=stream)


def test_the_only_printable_whitespace_is_the_space() -> None:
    """What the router's fast path of subject_token relies on (transforms.route._token)."""
    assert [c for c in map(chr, range(0x110000)) if c.isprintable() and (c.isspace() or c in ".*>%")] == [
        " ", "%", "*", ".", ">"]


@given(any_text)
def test_the_routers_token_is_subject_token(text: str) -> None:
    assert route._token(text) == subject_token(text)


def test_a_template_whose_start_proves_it_captured_checks_no_row() -> None:
    router = _router("{prefix}.{database}.{table}.{record.id}", stream=("wf.app.orders.>", "wf.*.items.*"))
    assert _route(router, {"id": 1}) == (b"wf.app.orders.1", b"")  # under wf.app.orders.>: proven
    assert _route(router, {"id": 2}, table="items") == (b"wf.app.items.2", b"")  # wf.*.items.*: checked
    assert router._shared[("public", "orders", "insert")].proven
    assert not router._shared[("public", "items", "insert")].proven  # each of its subjects is checked
    with pytest.raises(RoutingError, match="the sink's stream does not capture it"):
        _route(router, {"id": 3}, table="other")
    with pytest.raises(RoutingError, match="the sink's stream does not capture it"):
        _route(_router("{prefix}.{database}.{table}.{record.id}.x", stream=("wf.*.items.*",)), {"id": 4}, table="items")
    sequin = _router("{prefix}.{table}.{record.id}", stream=(">",), sink=_sink("sequin"))
    with pytest.raises(RoutingError, match="with destination.msg_id: sequin every subject must start"):
        _route(sequin, {"id": 1})  # '>' captures it, but it is outside the database's subjects


def test_a_rendered_subject_must_be_captured_by_the_stream() -> None:
    router = _router("{prefix}.{record.area}.{table}", stream=("wf.app.>", "wf.*.orders"))
    assert _route(router, {"area": "eu"}) == (b"wf.eu.orders", b"")
    assert _route(router, {"area": "app"}, table="other") == (b"wf.app.other", b"")
    with pytest.raises(RoutingError, match=r"^sinks\[0\]\.routing\.subject '\{prefix\}\.\{record\.area\}\.\{table\}' "
                                           r"gave a subject \(not shown: it holds the row's values\) that cannot be "
                                           r"published on: the sink's stream does not capture it"):
        _route(router, {"area": "eu"}, table="other")
    long = _router("{prefix}.{database}.{record.v}")
    with pytest.raises(RoutingError, match="longer than 1024 bytes"):
        _route(long, {"v": "x" * 1100})
    static = _router("{prefix}.{table}.all", stream=("wf.orders.*",))
    assert _route(static) == (b"wf.orders.all", b"")
    with pytest.raises(RoutingError, match=r"gave subject 'wf\.items\.all' for public\.items insert: the sink's stream"):
        _route(static, table="items")


def test_with_sequin_ids_every_subject_stays_under_the_database() -> None:
    sequin = _sink("sequin")
    everything = (">",)
    assert _route(_router("{prefix}.{database}.t.{record.id}", stream=everything, sink=sequin), {"id": 1}) == (
        b"wf.app.t.1", b"")
    with pytest.raises(FatalError, match=r"with destination\.msg_id: sequin every subject must start with 'wf\.app\.' "
                                         r"\('wf\.tenants\.' does not\)"):
        _router("{prefix}.tenants.{record.id}", stream=everything, sink=sequin)
    with pytest.raises(FatalError, match="must start with 'wf.app.'"):
        _router("{prefix}.{database}", stream=everything, sink=sequin)
    by_row = _router("{prefix}.{record.db}.{table}", stream=everything, sink=sequin)  # known per row only
    assert _route(by_row, {"db": "app"}) == (b"wf.app.orders", b"")
    with pytest.raises(RoutingError, match=r"gave a subject .* published on: with destination\.msg_id: sequin") as info:
        _route(by_row, {"db": "crm"})
    assert "crm" not in str(info.value)
    function = _function_router(lambda *_: {"subject": "wf.crm.x"}, stream=everything, sink=sequin)
    with pytest.raises(RoutingError, match=r"returned a subject .* published on: with destination\.msg_id: sequin"):
        _route(function)
    assert _route(_router("{prefix}.tenants.{record.id}", stream=everything), {"id": 1}) == (b"wf.tenants.1", b"")


# -- routing functions ---------------------------------------------------------------------------


def test_a_function_is_called_as_sequin_calls_it_and_gives_subject_and_headers() -> None:
    calls: list[tuple[Any, ...]] = []

    def route_it(action: str, record: dict[str, Any], changes: Any, metadata: dict[str, Any]) -> Any:
        calls.append((action, record, changes, metadata))
        return {"subject": f"wf.app.{record['tenant']}", "headers": {"X-Tenant": record["tenant"], "X-Any": "a.b c*"}}

    router = _function_router(route_it, key_header="Wf-Key")
    got = router("update", "public", "orders", {"tenant": "acme"}, {"tenant": "old"}, lambda: {"m": 1}, ("7",))
    assert got == (b"wf.app.acme", b'X-Tenant: acme\r\nX-Any: a.b c*\r\nWf-Key: ["7"]\r\n')
    assert calls == [("update", {"tenant": "acme"}, {"tenant": "old"}, {"m": 1})]
    assert _route(_function_router(lambda *_: {"subject": "wf.app.x"})) == (b"wf.app.x", b"")
    assert _route(_function_router(lambda *_: {"subject": "wf.app.x", "headers": None})) == (b"wf.app.x", b"")


def test_a_function_may_leave_the_subject_to_walflow_as_sequins_merge_does() -> None:
    subject, headers = _route(_function_router(lambda *_: {"headers": {"X-Tenant": "acme"}}))
    assert (subject, headers) == (None, b"X-Tenant: acme\r\n")


@pytest.mark.parametrize(("returned", "error"), [
    (None, r"returned a NoneType, not a mapping of 'subject' \(a str\) and, optionally, 'headers'"),
    ("wf.app.x", r"returned a str, not a mapping"),
    ({"subjetc": "wf.app.x"}, r"returned a dict, not a mapping"),
    ({"subject": "wf.app.x", "extra": 1}, "not a mapping of 'subject'"),
    ({"subject": b"wf.app.x"}, r"returned 'subject' a bytes, not a str"),
    ({"subject": "wf.app..x"}, r"returned a subject \(not shown: .*\) that cannot be published on: it has an empty token"),
    ({"subject": "wf.app.>"}, "wildcard token"),
    ({"subject": "wf.app.a b"}, "whitespace"),
    ({"subject": "wf.other.x"}, "the sink's stream does not capture it"),
    ({"subject": "wf.app.x", "headers": ["X-A"]}, r"returned 'headers' a list, not a mapping of str"),
    ({"subject": "wf.app.x", "headers": {"X-A": 1}}, r"returned a header value that is an int: a header value is a str"),
    ({"subject": "wf.app.x", "headers": {"X-A": "a\nb"}}, r"returned a header value that is a str holding a line break"),
    ({"subject": "wf.app.x", "headers": {"X A": "a"}}, r"returned a header name \(a str\) that is not letters, digits "
                                                       "and -"),
    ({"subject": "wf.app.x", "headers": {1: "a"}}, r"returned a header name \(an int\)"),
    ({"subject": "wf.app.x", "headers": {"Nats-Msg-Id": "mine"}}, r"returned a Nats-\* header: they are JetStream's "
                                                                  r"\(walflow always sets Nats-Msg-Id"),
    ({"subject": "wf.app.x", "headers": {"nats-expected-stream": "X"}}, "a Nats-\\* header: they are JetStream's"),
    ({"subject": "wf.app.x", "headers": {"wf-key": "mine"}}, "which is the key_header: leave it to walflow"),
])
def test_anything_else_a_function_returns_is_an_error(returned: Any, error: str) -> None:
    with pytest.raises(RoutingError, match=r"^sinks\[0\]\.routing: routing function shaping:route .*" + error):
        _route(_function_router(lambda *_: returned, key_header="Wf-Key"))


def test_a_function_that_raises_is_a_routing_error_with_its_cause_named_by_its_type_only() -> None:
    def broken(action: str, record: Row, *_: Any) -> Any:
        raise KeyError(f"no route for {record['tenant']}")

    with pytest.raises(RoutingError, match=r"^sinks\[0\]\.routing: routing function shaping:route raised KeyError$") as info:
        _route(_function_router(broken), {"tenant": "acme-canary"})
    # its cause is kept (compiled, mypyc chains it as the context alone: README, Performance)
    assert isinstance(info.value.__cause__ or info.value.__context__, KeyError)
    assert issubclass(RoutingError, ValueError) and issubclass(RoutingError, ValueFree)


# -- dead letters --------------------------------------------------------------------------------


def test_the_dead_letter_subject_by_default_and_from_its_template() -> None:
    assert _router().dead_letter("insert", "public", "orders") == b"wf.app.dead_letter"
    sink = _sink(on_error="dead_letter", dead_letter_subject="{prefix}.{database}.dlq.{sink}.{schema}.{table}.{action}")
    router = _router(sink=sink)
    assert router.dead_letter("delete", "Sales", "line.items") == b"wf.app.dlq.orders-out.Sales.line%2Eitems.delete"


def test_a_dead_letter_subject_holds_no_row_values() -> None:
    for holds in ("{record.id}", "{metadata.commit_lsn}"):
        with pytest.raises(FatalError, match=r"^sinks\[0\]\.dead_letter_subject: '.*' holds \{.*\}, but it may not "
                                             r"hold a row's values"):
            _router(sink=_sink(dead_letter_subject="{prefix}.{database}.dlq." + holds))


def test_a_dead_letter_subject_outside_the_stream_stops_the_sink_where_it_is_used() -> None:
    outside = _sink(on_error="dead_letter", dead_letter_subject="{prefix}.dead_letter")
    with pytest.raises(FatalError, match=r"^sinks\[0\]\.dead_letter_subject: '\{prefix\}\.dead_letter' cannot be "
                                         "published on: the sink's stream does not capture it"):
        _router(sink=outside)
    _router(sink=_sink(dead_letter_subject="{prefix}.dead_letter"))  # on_error: stop: checked when a message too large uses it
    per_table = _router(sink=_sink(on_error="dead_letter", dead_letter_subject="{prefix}.{table}.dlq"),
                        stream=("wf.app.>", "wf.orders.dlq"))
    assert per_table.dead_letter("insert", "public", "orders") == b"wf.orders.dlq"
    with pytest.raises(FatalError, match=r"^sinks\[0\]\.dead_letter_subject '\{prefix\}\.\{table\}\.dlq' gives "
                                         r"'wf\.items\.dlq' for public\.items insert, which cannot be published on, "
                                         "nor its dead letter: the sink's stream does not capture it"):
        per_table.dead_letter("insert", "public", "items")
    with pytest.raises(FatalError, match="with destination.msg_id: sequin every subject must start with 'wf.app.'"):
        _router(sink=_sink("sequin", on_error="dead_letter", dead_letter_subject="{prefix}.dlq"), stream=(">",))


# -- what the replay scan must read --------------------------------------------------------------


@pytest.mark.parametrize(("keys", "outside"), [
    ({}, False),
    ({"routing": "none"}, False),
    ({"routing": {"subject": "{prefix}.{database}.{record.tenant}"}}, False),
    ({"routing": {"subject": "{prefix}.{database}"}}, True),  # <prefix>.<database> itself is not under it
    ({"routing": {"subject": "{prefix}.tenants.{record.tenant}"}}, True),
    ({"routing": {"subject": "{prefix}.{record.db}.x"}}, True),
    ({"routing": {"python": "shaping:route"}}, True),
    ({"tables": [{"name": "public.t", "routing": {"subject": "elsewhere.{table}"}}]}, True),
    ({"tables": [{"name": "public.t", "routing": {"python": "shaping:route"}}]}, True),
    ({"on_error": "dead_letter"}, False),
    ({"on_error": "dead_letter", "dead_letter_subject": "{prefix}.dead_letter"}, True),
    ({"dead_letter_subject": "{prefix}.dead_letter"}, True),  # used by a message too large for the server
    ({"routing": {"subject": "{prefix}.{bogus}"}}, True),  # refused by the router; meanwhile, the worst
])
def test_publishes_outside_the_databases_subjects(keys: dict[str, Any], outside: bool) -> None:
    assert publishes_outside(_sink(**keys), "app") is outside


def test_a_sink_that_routes_outside_its_subjects_scans_the_whole_stream() -> None:
    assert replay_subjects(_sink(routing={"python": "shaping:route"}), "app") == ">"
    assert replay_subjects(_sink(routing={"subject": "{prefix}.{database}.{record.tenant}"}), "app") == "wf.app.>"
    # with Sequin's ids the router keeps every subject under the database's
    assert replay_subjects(_sink("sequin", routing={"python": "shaping:route"}), "app") == "wf.app.>"
    assert replay_subjects(_sink(on_error="dead_letter", dead_letter_subject="{prefix}.tenants.dead"), "app") == ">"
    assert replay_subjects(_sink(), "my db") == "wf.my%20db.>"
