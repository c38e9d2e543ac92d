"""Transforms on hand-made messages: Sequin's path traversal, Python transforms, their payloads and errors; no servers."""

from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal
from typing import Any

import pytest

from config.shaping import PathTransform, TransformFunction
from core.events import UNCHANGED_TOAST, Row
from tests.transforms.samples import TS, TS_US, make_database, make_sink
from tests.transforms.test_envelope import make_change
from transforms.envelope import Envelope, encode_json
from transforms.payload import Transformer, TransformError, path_value

RECORD: Row = {
    "id": 7,
    "name": "Ada",
    "paid": False,
    "note": None,
    "amount": Decimal("12.50"),
    "at": TS,
    "day": dt.date(2024, 2, 29),
    "address": {"city": "Utrecht", "geo": {"lat": 52.09}, "lines": ["Oudegracht 1"], "zip": None},
    "tags": ["a", "b"],
    "body": UNCHANGED_TOAST,
}
CHANGES: Row = {"name": "Bob"}


def metadata(enrichment: Any = None) -> dict[str, Any]:
    change = make_change("update", new=RECORD, old=dict(RECORD, name="Bob"))
    step = Envelope(make_sink(), make_database())
    return step.metadata(change, change.pks, step.key(change), enrichment)


def value(path: str, changes: Row | None = CHANGES, enrichment: Any = None) -> Any:
    return path_value(path, "update", RECORD, changes, metadata(enrichment))


def transformer(spec: PathTransform | TransformFunction, function: Any = None,
                timestamp_format: Any = "iso8601") -> Transformer:
    return Transformer(spec, function, timestamp_format)


def payload(step: Transformer, action: str = "update", changes: Row | None = CHANGES, enrichment: Any = None) -> Any:
    return json.loads(step(action, RECORD, changes, metadata(enrichment)))


# -- path_value: Sequin's traversal ------------------------------------------------------------


@pytest.mark.parametrize(("path", "expected"), [
    ("record", RECORD),
    ("record.id", 7),
    ("record.amount", Decimal("12.50")),
    ("record.address.city", "Utrecht"),  # into a JSON column
    ("record.address.geo.lat", 52.09),
    ("record.address.lines", ["Oudegracht 1"]),  # a list at the end is the value
    ("record.paid", False),  # false is a value, not a missing key
    ("record.body", UNCHANGED_TOAST),
    ("changes", CHANGES),
    ("changes.name", "Bob"),
    ("action", "update"),
    ("metadata.table_name", "orders"),
    ("metadata.consumer.name", "app-to-nats"),
    ("metadata.commit_timestamp", TS),
    ("metadata.record_pks", ["7"]),
])
def test_a_path_finds_the_value_there(path: str, expected: Any) -> None:
    assert value(path) == expected


@pytest.mark.parametrize("path", [
    "record.missing",
    "record.missing.deeper",
    "record.note",  # null
    "record.note.deeper",  # a null stops the walk: Sequin's nil -> nil
    "record.address.zip.code",
    "record.address.street",
    "record.tags.0",  # Sequin does not index lists
    "record.address.lines.first",
    "record.at.year",  # a DateTime is a struct in Sequin: a map without the key
    "record.day.year",
    "record.amount.coef",  # so is a Decimal
    "metadata.commit_timestamp.year",
    "metadata.transaction_annotations.user",  # none
    "metadata.enrichment.tier",  # none
    "metadata.missing",
    "unknown",
])
def test_a_missing_key_a_null_a_list_or_a_struct_on_the_way_give_none(path: str) -> None:
    assert value(path) is None


def test_changes_null_gives_none_below_it() -> None:
    assert value("changes", changes=None) is None
    assert value("changes.name", changes=None) is None
    assert value("changes.name", changes={}) is None


def test_a_path_into_the_enrichment() -> None:
    assert value("metadata.enrichment.tier", enrichment={"tier": "gold"}) == "gold"


@pytest.mark.parametrize(("path", "message"), [
    ("record.id.x", "path record.id.x: record.id is an int, which has no keys"),
    ("record.name.first", "path record.name.first: record.name is a str, which has no keys"),
    ("record.paid.x", "record.paid is a bool"),
    ("record.address.geo.lat.x", "record.address.geo.lat is a float"),
    ("record.body.x", "record.body is a core.events.UnchangedToast"),  # Sequin's marker is a string
    ("action.x", "path action.x: action is a str"),  # an atom in Sequin: no clause either
    ("metadata.commit_lsn.x", "metadata.commit_lsn is an int"),
])
def test_a_key_looked_up_in_a_scalar_fails_as_sequins_function_does(path: str, message: str) -> None:
    with pytest.raises(TypeError, match=message.replace(".", r"\.")) as caught:
        value(path)
    assert "Ada" not in str(caught.value)  # names the type, never the row's value


# -- path transforms -----------------------------------------------------------------------------


def test_a_path_transforms_payload_is_the_value_as_json() -> None:
    step = transformer(PathTransform(path="record"))
    assert step("update", RECORD, CHANGES, metadata()) == encode_json(RECORD)
    assert payload(step) == {
        "id": 7, "name": "Ada", "paid": False, "note": None, "amount": "12.50", "at": "2026-11-30T04:00:00.123456Z",
        "day": "2024-02-29", "address": RECORD["address"], "tags": ["a", "b"], "body": "unchanged_toast"}


@pytest.mark.parametrize(("path", "text"), [
    ("action", b'"update"'),  # a string is a JSON string, as Jason encodes it
    ("record.id", b"7"),
    ("record.missing", b"null"),
    ("record.amount", b'"12.50"'),
    ("record.address.geo", b'{"lat":52.09}'),
    ("changes", b'{"name":"Bob"}'),
])
def test_path_payloads(path: str, text: bytes) -> None:
    assert transformer(PathTransform(path=path))("update", RECORD, CHANGES, metadata()) == text


def test_a_path_into_metadata_keeps_iso_timestamps_under_unix_microsecond() -> None:
    """Sequin converts record and changes only, before the functions run: metadata stays ISO."""
    unix = "unix_microsecond"
    assert payload(transformer(PathTransform(path="record.at"), timestamp_format=unix)) == TS_US
    assert payload(transformer(PathTransform(path="record"), timestamp_format=unix))["at"] == TS_US
    iso = "2026-11-30T04:00:00.123456Z"
    assert payload(transformer(PathTransform(path="metadata.commit_timestamp"), timestamp_format=unix)) == iso
    assert payload(transformer(PathTransform(path="metadata"), timestamp_format=unix))["commit_timestamp"] == iso
    enriched = payload(transformer(PathTransform(path="metadata.enrichment"), timestamp_format=unix),
                       enrichment={"since": TS})
    assert enriched == {"since": iso}


def test_a_path_through_a_scalar_is_a_transform_error() -> None:
    step = transformer(PathTransform(path="record.id.x"))
    with pytest.raises(TransformError, match=r"transform path record\.id\.x: record\.id is an int") as caught:
        step("update", RECORD, CHANGES, metadata())
    assert isinstance(caught.value.__cause__, TypeError)
    assert isinstance(caught.value, ValueError)
    assert step.name == "path record.id.x"


# -- Python transforms ---------------------------------------------------------------------------


def test_a_python_transform_is_called_as_sequins_functions_and_its_value_is_the_payload() -> None:
    calls: list[tuple[Any, ...]] = []

    def transform(action: str, record: Row, changes: Row | None, metadata: dict[str, Any]) -> Any:
        calls.append((action, record, changes, metadata))
        return {"id": record["id"], "action": action, "was": (changes or {}).get("name"),
                "table": metadata["table_name"], "at": metadata["commit_timestamp"], "total": record["amount"]}

    step = transformer(TransformFunction(python="shaping:transform"), transform)
    given = metadata()
    out = step("update", RECORD, CHANGES, given)
    assert calls == [("update", RECORD, CHANGES, given)]
    assert calls[0][1] is RECORD and calls[0][3] is given  # the values themselves, positionally
    assert json.loads(out) == {"id": 7, "action": "update", "was": "Bob", "table": "orders",
                               "at": "2026-11-30T04:00:00.123456Z", "total": "12.50"}
    assert step.name == "shaping:transform"


def test_a_python_transforms_datetimes_follow_timestamp_format() -> None:
    step = transformer(TransformFunction(python="m:f"), lambda a, r, c, m: [r["at"], m["commit_timestamp"]],
                       "unix_microsecond")
    assert payload(step) == [TS_US, TS_US]  # where a datetime came from is not known: documented


@pytest.mark.parametrize("result", [None, "text", 3, [1, "a"], {"nested": {"n": Decimal("1E-8")}}, True])
def test_any_json_value_is_a_payload(result: Any) -> None:
    step = transformer(TransformFunction(python="m:f"), lambda *_: result)
    assert step("insert", RECORD, None, metadata()) == encode_json(result)


def test_a_function_that_raises_is_a_transform_error_with_its_cause() -> None:
    def transform(action: str, record: Row, changes: Row | None, metadata: dict[str, Any]) -> Any:
        return record["x"]

    step = transformer(TransformFunction(python="shaping.orders:transform"), transform)
    with pytest.raises(TransformError) as caught:
        step("insert", RECORD, None, metadata())
    assert str(caught.value) == "transform shaping.orders:transform raised KeyError"  # never its text
    assert isinstance(caught.value.__cause__, KeyError)


@pytest.mark.parametrize(("result", "message"), [
    ({"a", "b"}, "transform m:f returned a set, which is not JSON"),
    ({"payload": b"raw"}, "transform m:f returned a bytes, which is not JSON"),
    ([1, {2: "x"}], "transform m:f returned a dict with an int key, which is not JSON"),
    (object(), "transform m:f returned an object, which is not JSON"),
    (dt.timedelta(1), "transform m:f returned a datetime.timedelta, which is not JSON"),
])
def test_a_value_that_is_not_json_is_a_transform_error(result: Any, message: str) -> None:
    step = transformer(TransformFunction(python="m:f"), lambda *_: result)
    with pytest.raises(TransformError) as caught:
        step("insert", RECORD, None, metadata())
    assert str(caught.value) == message
    assert isinstance(caught.value.__cause__, ValueError)


def test_the_function_is_given_exactly_when_the_spec_names_one() -> None:
    with pytest.raises(ValueError, match="takes no function"):
        Transformer(PathTransform(path="record"), lambda *_: None, "iso8601")
    with pytest.raises(ValueError, match="m:f: its function was not given"):
        Transformer(TransformFunction(python="m:f"), None, "iso8601")
