"""json and jsonb values of any depth Postgres accepts, through a sink partition's every path:
published as that JSON (held as their text, a JsonText, beyond what Python's values carry), and
every step that looks at values total for them. No servers: the texts are what Postgres prints
(``tests/connectors/postgres/test_types.py`` checks that against a real one)."""

from __future__ import annotations

import hmac
import json
import logging
import sys
from pathlib import Path
from typing import Any

import pytest

from config.schema import SinkConfig
from connectors.postgres.types import MAX_JSON_DEPTH, TypeSpecs, loaders_for
from core.errors import FatalError
from core.events import JsonText, RawChange, ReadOf, Row, Table
from core.message import Message
from core.wire import DESCRIBE, pack
from tests.pipeline import any_depth, loads_any_depth
from tests.transforms.samples import ROOM, TS, make_database, make_render, make_sink
from transforms.convert import convert
from transforms.envelope import Envelope, encode_json

INT4, JSON, JSONB, TIMESTAMP, JSONB_ARRAY = 23, 114, 3802, 1114, 3807
DEPTHS = [MAX_JSON_DEPTH, MAX_JSON_DEPTH + 1, 254, 255, 256, 300, 1024, 1025, 1500]
SECRET = "s3cret"


def deep_jsonb(levels: int, inner: bytes = b'{"a": 1, "tag": "deep-canary"}') -> bytes:
    """A jsonb's text as Postgres prints it: ``levels`` arrays around ``inner`` (an object counts one)."""
    return b"[" * (levels - 1) + inner + b"]" * (levels - 1)


def deep_json(levels: int) -> bytes:
    """A json's text as written (Postgres keeps it): whitespace and a duplicate key."""
    return b" " + b"[ " * (levels - 1) + b'{"a" : 1, "a": 2}' + b" ]" * (levels - 1) + b"\n"


_TYPES = TypeSpecs((INT4, JSONB, JSON, TIMESTAMP, JSONB_ARRAY), ())
#: One table version: its loaders are the catalog's, rebuilt from its types as a sink partition rebuilds them.
TABLE = Table("public", "docs", ("id", "doc", "raw", "at", "docs"), ("id",), ("id",), loaders_for(_TYPES), "app", 1,
              loaders_for, _TYPES)


def row(doc: bytes | None, raw: bytes | None = None, at: bytes = b"2026-11-30 04:00:00.5", docs: bytes | None = None,
        row_id: int = 7) -> tuple[bytes | None, ...]:
    return (str(row_id).encode(), doc, raw, at, docs)


def change(new: tuple[bytes | None, ...] | None, action: Any = "insert", old: tuple[bytes | None, ...] | None = None,
           read: ReadOf | None = None, annotations: bytes | None = None) -> RawChange:
    return RawChange(action, TABLE, new, old, False, 107, 0, TS, 9, read, annotations)


def sink(**fields: Any) -> SinkConfig:
    return make_sink(destination={"type": "nats", "host": "localhost", "subject_prefix": "wf"}, **fields)


def rendered(*changes: RawChange, shaped: SinkConfig | None = None, beside: Path | None = None) -> list[Message]:
    """The messages a sink partition makes of ``changes`` (unshaped unless ``shaped``)."""
    render = make_render(shaped or sink(), beside=beside, secret=SECRET)
    return render([[(DESCRIBE, changes[0].table), *(pack(c) for c in changes)]], ROOM)


def payload(message: Message) -> Any:
    return loads_any_depth(message.payload)


# -- published as that JSON ----------------------------------------------------------------------


@pytest.mark.parametrize("levels", DEPTHS)
def test_json_and_jsonb_of_any_depth_are_published_as_that_json(levels: int) -> None:
    doc, raw = deep_jsonb(levels), deep_json(levels)
    whole_second = b"2026-11-30 04:00:00"  # a row the exact encoder writes
    messages = rendered(change(row(doc, raw)), change(row(doc, raw, at=whole_second)),
                        change(row(doc, raw), "update", old=row(deep_jsonb(levels, b"2"), raw)),
                        change(None, "delete", old=row(doc, raw)),
                        change(row(doc, raw), "read", read=ReadOf("app-to-nats", "bf1", '["7"]')))
    with any_depth():
        for message in messages:
            record = payload(message)["record"]
            assert record["doc"] == loads_any_depth(doc) and record["raw"] == loads_any_depth(raw)
            if levels > MAX_JSON_DEPTH:  # Postgres's text, as it is: json keeps its whitespace and duplicate key
                assert b'"doc":' + doc + b',"raw":' + raw + b',"at":' in message.payload
        assert payload(messages[2])["changes"] == {"doc": loads_any_depth(deep_jsonb(levels, b"2"))}
    assert [payload(m)["action"] for m in messages] == ["insert", "insert", "update", "delete", "read"]


def test_an_array_of_jsonb_holds_each_element_as_that_json() -> None:
    deep, shallow = deep_jsonb(300), b'{"x": [1, 2]}'
    array = b'{"' + deep.replace(b'"', b'\\"') + b'","' + shallow.replace(b'"', b'\\"') + b'",NULL}'
    (message,) = rendered(change(row(b"1", docs=array)))
    assert payload(message)["record"]["docs"] == [loads_any_depth(deep), {"x": [1, 2]}, None]
    assert b"[" + deep + b',{"x":[1,2]},null]' in message.payload


def test_a_two_dimensional_array_of_jsonb_holds_each_element_on_either_encoder() -> None:
    deep = deep_jsonb(300)
    array = b'{{"' + deep.replace(b'"', b'\\"') + b'",NULL},{"{}","1"}}'
    for at in (b"2026-11-30 04:00:00.5", b"2026-11-30 04:00:00"):  # orjson's path, then the exact encoder's
        (message,) = rendered(change(row(b"1", docs=array, at=at)))
        assert b'"docs":[[' + deep + b",null],[{},1]]" in message.payload, at


def test_a_wide_document_is_published_as_a_shallow_one_is() -> None:
    wide = json.dumps([{"id": i, "tags": ["a", {"b": [i]}]} for i in range(1000)]).encode()
    (message,) = rendered(change(row(wide)))
    assert payload(message)["record"]["doc"] == json.loads(wide)
    assert b'"doc":' + json.dumps(json.loads(wide), separators=(",", ":")).encode() in message.payload  # compact


def test_the_envelope_and_debezium_embed_a_raw_json_as_it_is() -> None:
    value = JsonText(deep_jsonb(400))
    step = Envelope(sink(), make_database())
    for row_ in ({"id": 1, "doc": value}, {"id": 1, "doc": value, "n": float("nan")}, {"id": 1, "doc": [value, None]}):
        assert deep_jsonb(400) in step.encode_row(row_)
    debezium = rendered(change(row(deep_jsonb(400))), shaped=sink(envelope="debezium"))[0]
    assert payload(debezium)["after"]["doc"] == loads_any_depth(deep_jsonb(400))


# -- steps that look at values ------------------------------------------------------------------


def test_a_where_path_into_a_deep_value_follows_on_error_and_never_quotes_it() -> None:
    where = [{"column": "doc", "path": "a", "eq": 1}]
    dead = sink(on_error="dead_letter", tables=[{"name": "public.docs", "where": where}])
    (message,) = rendered(change(row(deep_jsonb(300))), shaped=dead)
    error = payload(message)["error"]
    assert error == {"step": "where", "message": f"sinks[0].tables[0].where[0]: column doc holds a json value nested "
                     f"deeper than {MAX_JSON_DEPTH} levels (or holding a number beyond a double, or a lone surrogate "
                     "escape), which is published as its text and which a path cannot look into"}
    assert b"deep-canary" not in message.payload
    shallow = rendered(change(row(b'{"a": 1}')), shaped=dead)
    assert payload(shallow[0])["record"]["doc"] == {"a": 1}  # the same condition on a shallow value
    stop = sink(tables=[{"name": "public.docs", "where": where}])
    with pytest.raises(FatalError, match=r"where failed for public\.docs insert at commit LSN 0/6B \(commit_idx 0, "
                                         r"record_pks \[\"7\"\]\): sinks\[0\]\.tables\[0\]\.where\[0\]: column doc"):
        rendered(change(row(deep_jsonb(300))), shaped=stop)


def test_a_sequin_field_path_into_a_deep_value_follows_on_error() -> None:
    filters = [{"column_name": "doc", "field_path": "a", "operator": "=", "comparison_value": 1}]
    dead = sink(on_error="dead_letter", tables=[{"name": "public.docs", "filters": filters}])
    (message,) = rendered(change(row(deep_jsonb(300))), shaped=dead)
    assert payload(message)["error"]["step"] == "where" and b"deep-canary" not in message.payload


def test_conditions_without_a_path_and_masks_see_the_text() -> None:
    tables = [{"name": "public.docs", "where": [{"column": "doc", "matches": "deep-can[a]ry"}, {"column": "doc", "ne": 1}],
               "columns": {"mask": {"raw": "hash"}}}]
    (message,) = rendered(change(row(deep_jsonb(300), deep_json(300))), shaped=sink(tables=tables))
    record = payload(message)["record"]
    assert record["doc"] == loads_any_depth(deep_jsonb(300))
    assert record["raw"] == hmac.new(SECRET.encode(), deep_json(300), "sha256").hexdigest()
    kept = rendered(change(row(deep_jsonb(300, b'"other"'))), shaped=sink(tables=tables))
    assert kept == []  # matches found no 'deep-canary' in its text


def test_transforms_embed_it_and_a_path_into_it_follows_on_error(tmp_path: Path) -> None:
    (tmp_path / "deep_fns.py").write_text(
        "def whole(action, record, changes, metadata):\n"
        "    return {'wrapped': [record['doc']], 'text_len': len(record['doc'].text)}\n"
        "def keep(action, record, changes, metadata):\n"
        "    return type(record['doc']).__name__ == 'JsonText' and record['doc'].text.startswith(b'[[')\n")
    sys.modules.pop("deep_fns", None)
    doc = deep_jsonb(500)
    (by_path,) = rendered(change(row(doc)), shaped=sink(transform={"path": "record.doc"}))
    assert by_path.payload == doc
    (python,) = rendered(change(row(doc)), shaped=sink(transform={"python": "deep_fns:whole"},
                                                       filter={"python": "deep_fns:keep"}), beside=tmp_path)
    assert python.payload == b'{"wrapped":[' + doc + b'],"text_len":%d}' % len(doc)
    (dead,) = rendered(change(row(doc)), shaped=sink(transform={"path": "record.doc.a"}, on_error="dead_letter"))
    assert payload(dead)["error"]["step"] == "transform" and b"deep-canary" not in dead.payload


def test_encode_json_embeds_a_raw_json_and_writes_a_deep_value_in_pieces() -> None:
    value = JsonText(deep_jsonb(300))
    assert encode_json({"a": [value, 1.5]}) == b'{"a":[' + deep_jsonb(300) + b",1.5]}"
    nested: Any = "x"
    for _ in range(300):  # deeper than the exact encoder writes, built by a transform
        nested = [nested]
    assert encode_json(nested) == b"[" * 300 + b'"x"' + b"]" * 300


# -- transaction annotations -------------------------------------------------------------------


def annotations_of(text: bytes, caplog: pytest.LogCaptureFixture | None = None) -> tuple[bytes, Any]:
    """What ``text`` set as annotations becomes: in the payload (its bytes there), and in a callable's metadata."""
    step = Envelope(sink(), make_database())
    change_ = RawChange("insert", TABLE, row(b"1"), None, False, 107, 0, TS, 9, None, text)
    converted = convert(change_)
    published = step(converted).payload
    start = published.index(b'"transaction_annotations":') + len(b'"transaction_annotations":')
    end = published.index(b',"enrichment":')
    return published[start:end], step.metadata(converted, (), b"k")["transaction_annotations"]


@pytest.mark.parametrize("levels", [2, MAX_JSON_DEPTH + 1, 300, 1025, 1500])
def test_annotations_of_any_depth_are_published_as_that_json(levels: int) -> None:
    text = deep_jsonb(levels, b'{"user": "paul"}')
    published, seen = annotations_of(text)
    if levels <= MAX_JSON_DEPTH:
        assert published == json.dumps(json.loads(text), separators=(",", ":")).encode()
    else:
        assert published == text and seen == JsonText(text)


@pytest.mark.parametrize("text", [
    b"[" * 1500 + b"]" * 1499,  # deep and not JSON
    b"[" * 1500 + b"1,]" + b"]" * 1499,
    b"{ invalid }", b'{"a": NaN}', b"\xff\xfe", b'{"n": 12345678901234567890, "x": Infinity}', b"",
])
def test_annotations_that_are_not_json_are_null_with_one_warning_that_never_quotes_them(
    text: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, "walflow.envelope"):
        assert annotations_of(text) == (b"null", None)
        assert annotations_of(text + b" ") == (b"null", None)  # another transaction's: no second warning
    assert [r.getMessage() for r in caplog.records] == [
        "transaction annotations that are not JSON are published as null (their text is not shown; this is logged "
        "once)"]


@pytest.mark.parametrize("text", [b'{"u": "\\ud800"}', b'{"n": 1e400}', b'{"n": 123456789012345678901234567890}'])
def test_annotations_python_would_read_inexactly_are_published_as_their_text_or_exactly(text: bytes) -> None:
    published, _ = annotations_of(text)
    assert published in (text, json.dumps(json.loads(text), separators=(",", ":")).encode())
    assert published != b"null"


def test_a_row_of_the_source_never_raises_in_the_envelope(caplog: pytest.LogCaptureFixture) -> None:
    """Every json text Postgres can print, whatever its depth, encodes; nothing reaches the stream as an exception."""
    texts = [deep_jsonb(n) for n in (1, 100, MAX_JSON_DEPTH, MAX_JSON_DEPTH + 1, 2000)] + [
        b'"\\ud800"', b'{"a": 1e400}', b"[" * 600 + b"12345678901234567890" + b"]" * 600, b'"\\u0000"']
    messages = rendered(*(change(row(text, text)) for text in texts))
    assert len(messages) == len(texts)
    for text, message in zip(texts, messages, strict=True):
        record: Row = payload(message)["record"]
        with any_depth():
            assert record["doc"] == record["raw"] == loads_any_depth(text)
