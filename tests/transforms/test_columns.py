"""``columns:`` on hand-made rows: include, exclude, rename, every mask, record_pks, the errors; no servers."""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import uuid
from decimal import Decimal
from typing import Any

import pytest

from config.shaping import Columns
from core.errors import FatalError
from core.events import UNCHANGED_TOAST, Row, Table
from transforms.columns import ColumnShaper, value_text

COLUMNS = ("id", "email", "ssn", "card", "note", "payload")
ROW: Row = {"id": 7, "email": "ann@example.com", "ssn": "123-45-6789", "card": "4111111111111234", "note": "hi",
            "payload": {"a": 1}}
PATH = "sinks[0].tables[1].columns"
SECRET = "s3cret"


def make_table(columns: tuple[str, ...] = COLUMNS, key: tuple[str, ...] = ("id",)) -> Table:
    """A table version as the source describes it (loaders unused here)."""
    return Table("public", "customers", columns, key, key, tuple(bytes.decode for _ in columns), "app")


def shaper(table: Table | None = None, secret: str | None = SECRET, **columns: Any) -> ColumnShaper:
    return ColumnShaper(Columns.model_validate(columns), secret, table or make_table(), PATH)


def hashed(text: str, secret: str = SECRET) -> str:
    return hmac.new(secret.encode(), text.encode(), hashlib.sha256).hexdigest()


# -- which columns, under which names ----------------------------------------------------------


def test_include_keeps_the_tables_column_order() -> None:
    out = shaper(include=["note", "id", "email"]).row(ROW)
    assert list(out) == ["id", "email", "note"]
    assert out == {"id": 7, "email": "ann@example.com", "note": "hi"}


def test_exclude_leaves_the_columns_out() -> None:
    assert shaper(exclude=["ssn", "card"]).row(ROW) == {"id": 7, "email": "ann@example.com", "note": "hi",
                                                         "payload": {"a": 1}}


def test_rename_publishes_under_the_new_name_in_place() -> None:
    out = shaper(rename={"email": "mail", "id": "customer_id"}).row(ROW)
    assert list(out) == ["customer_id", "mail", "ssn", "card", "note", "payload"]
    assert out["mail"] == "ann@example.com" and out["customer_id"] == 7


def test_renames_may_swap_two_names() -> None:
    assert shaper(rename={"email": "note", "note": "email"}, include=["id", "email", "note"]).row(ROW) == {
        "id": 7, "note": "ann@example.com", "email": "hi"}


def test_mask_applies_after_rename() -> None:
    out = shaper(rename={"ssn": "tax_id"}, mask={"ssn": "redact"}, exclude=["card"]).row(ROW)
    assert out["tax_id"] == "[redacted]" and "ssn" not in out and "card" not in out


def test_a_row_without_some_columns_has_fewer_keys() -> None:
    key_only: Row = {"id": 7}
    assert shaper(include=["id", "email"], mask={"email": "hash"}).row(key_only) == {"id": 7}
    assert shaper(mask={"email": "hash"}).row(key_only) == {"id": 7}
    assert shaper(rename={"email": "mail"}).row({"id": 7, "note": "x"}) == {"id": 7, "note": "x"}


def test_the_input_row_is_never_changed() -> None:
    row = dict(ROW)
    shaper(mask={"ssn": "redact"}).row(row)
    shaper(rename={"ssn": "x"}, exclude=["card"]).row(row)
    assert row == ROW


def test_nothing_to_do_returns_the_row_itself() -> None:
    row = dict(ROW)
    assert shaper().row(row) is row
    assert shaper(mask={"ssn": "redact"}).row({"id": 1, "ssn": None}) == {"id": 1, "ssn": None}


# -- masks -------------------------------------------------------------------------------------


@pytest.mark.parametrize(("mask", "expected"), [
    ("hash", hashed("4111111111111234")),
    ({"hash": True}, hashed("4111111111111234")),
    ({"hash": True, "secret": "other"}, hashed("4111111111111234", "other")),
    ("redact", "[redacted]"),
    ({"truncate": 4}, "4111"),
    ({"truncate": 99}, "4111111111111234"),
    ({"keep_first": 4}, "4111************"),
    ({"keep_first": 99}, "4111111111111234"),
    ({"keep_last": 4}, "************1234"),
    ({"keep_last": 99}, "4111111111111234"),
])
def test_each_mask_on_a_text(mask: Any, expected: str) -> None:
    assert shaper(mask={"card": mask}).row(ROW)["card"] == expected


def test_keep_last_longer_than_a_short_text_keeps_it_whole() -> None:
    assert shaper(mask={"note": {"keep_last": 3}}).row(ROW)["note"] == "hi"
    assert shaper(mask={"note": {"keep_first": 1}}).row(ROW)["note"] == "h*"


@pytest.mark.parametrize(("value", "text"), [
    (7, "7"),
    (-12.5, "-12.5"),
    (True, "true"),
    (Decimal("0.00000001"), "0.00000001"),  # positional, as Postgres prints it (str() would give 1E-8)
    (Decimal("12.50"), "12.50"),
    (uuid.UUID("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"), "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"),
    (dt.datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=dt.UTC), "2026-01-02T03:04:05.000006Z"),
    (dt.date(2026, 1, 2), "2026-01-02"),
    ({"a": [1, "x"]}, '{"a":[1,"x"]}'),
    ([1, None], "[1,null]"),
    ({"months": 1, "days": 2, "microseconds": 3}, '{"months":1,"days":2,"microseconds":3}'),
    ("\\xdeadbeef", "\\xdeadbeef"),
    ("a \"quoted\" text", "a \"quoted\" text"),
    ({"s": "\ud800"}, '{"s":"\ud800"}'),  # a json column's lone surrogate: to_json refuses it, the fallback does not
])
def test_the_text_a_mask_works_on(value: Any, text: str) -> None:
    assert value_text(value) == text
    out = shaper(mask={"payload": {"truncate": 1000}}, include=["id", "payload"]).row({"id": 1, "payload": value})
    assert out["payload"] == text


def test_every_mask_publishes_a_string_for_any_value() -> None:
    for mask in ("hash", "redact", {"truncate": 2}, {"keep_first": 1}, {"keep_last": 1}):
        out = shaper(mask={"payload": mask}).row({"id": 1, "payload": 12345})
        assert type(out["payload"]) is str
    assert shaper(mask={"payload": {"keep_last": 2}}).row({"id": 1, "payload": 12345})["payload"] == "***45"


@pytest.mark.parametrize("mask", ["hash", "redact", {"truncate": 1}, {"keep_first": 1}, {"keep_last": 1}])
def test_null_and_unchanged_toast_are_not_masked(mask: Any) -> None:
    columns = shaper(mask={"ssn": mask, "note": mask})
    assert columns.row({"id": 1, "ssn": None, "note": UNCHANGED_TOAST}) == {"id": 1, "ssn": None,
                                                                         "note": UNCHANGED_TOAST}
    projected = shaper(mask={"ssn": mask, "note": mask}, exclude=["card"])
    assert projected.row({"id": 1, "ssn": None, "note": UNCHANGED_TOAST}) == {"id": 1, "ssn": None,
                                                                           "note": UNCHANGED_TOAST}


def test_a_hash_uses_the_default_secret_unless_the_mask_has_its_own() -> None:
    out = shaper(secret="default", mask={"email": "hash", "ssn": {"hash": True, "secret": "own"}}).row(ROW)
    assert out["email"] == hashed("ann@example.com", "default")
    assert out["ssn"] == hashed("123-45-6789", "own")


# -- record_pks -----------------------------------------------------------------------------


@pytest.mark.parametrize(("value", "pk_text"), [
    (7, "7"),
    (9_223_372_036_854_775_807, "9223372036854775807"),
    ("ann@example.com", "ann@example.com"),
    (uuid.UUID("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"), "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"),
    (Decimal("0.00000001"), "0.00000001"),
])
def test_a_masked_key_hashes_alike_in_the_row_and_in_record_pks(value: Any, pk_text: str) -> None:
    columns = shaper(mask={"id": "hash"})
    assert columns.masks_key
    assert columns.row({"id": value})["id"] == columns.pks((pk_text,))[0] == hashed(pk_text)


def test_pks_masks_only_the_masked_key_columns_in_column_order() -> None:
    table = make_table(("tenant", "id", "name"), key=("id", "tenant"))  # key order is column order in record_pks
    columns = shaper(table, mask={"id": {"keep_last": 2}})
    assert columns.masks_key
    assert columns.pks(("acme", "12345")) == ("acme", "***45")
    assert columns.row({"tenant": "acme", "id": 12345, "name": "n"}) == {"tenant": "acme", "id": "***45", "name": "n"}


def test_pks_untouched_without_a_masked_key() -> None:
    columns = shaper(mask={"ssn": "hash"})
    assert not columns.masks_key
    pks = ("7",)
    assert columns.pks(pks) is pks
    assert shaper(make_table(key=()), mask={"ssn": "hash"}).pks(()) == ()


# -- errors at construction --------------------------------------------------------------------


@pytest.mark.parametrize(("columns", "key"), [
    ({"include": ["id", "emial"]}, "include[1]"),
    ({"exclude": ["emial"]}, "exclude[0]"),
    ({"rename": {"emial": "mail"}}, "rename.emial"),
    ({"mask": {"emial": "hash"}}, "mask.emial"),
])
def test_a_column_the_table_does_not_have_is_refused(columns: dict[str, Any], key: str) -> None:
    with pytest.raises(FatalError) as caught:
        shaper(**columns)
    message = str(caught.value)
    assert message.startswith(f"{PATH}.{key}: table public.customers has no column 'emial' (its columns: id, email, "
                              "ssn, card, note, payload): correct the name")
    assert "\n" not in message


@pytest.mark.parametrize(("columns", "key"), [
    ({"exclude": ["id"]}, "exclude"),
    ({"include": ["email"]}, "include"),
])
def test_a_key_column_left_out_is_refused_with_mask_as_the_fix(columns: dict[str, Any], key: str) -> None:
    with pytest.raises(FatalError) as caught:
        shaper(**columns)
    message = str(caught.value)
    assert message.startswith(f"{PATH}.{key}: 'id' is a key column of table public.customers (key: id) and must be "
                              "published: mask it instead (mask: {id: hash})")
    assert "record_pks" in message


def test_a_rename_onto_another_published_column_is_refused() -> None:
    with pytest.raises(FatalError, match=r"^sinks\[0\]\.tables\[1\]\.columns\.rename\.email: 'note' is also the "
                                         r"published name of another column of table public\.customers"):
        shaper(rename={"email": "note"})
    shaper(rename={"email": "note"}, exclude=["note"])  # the other one is not published: fine


def test_a_hash_without_any_secret_is_refused() -> None:
    with pytest.raises(FatalError, match=r"^sinks\[0\]\.tables\[1\]\.columns\.mask\.ssn: a hash needs a secret: set "
                                         r"walflow\.mask_secret"):
        shaper(secret=None, mask={"ssn": "hash"})
    assert shaper(secret=None, mask={"ssn": {"hash": True, "secret": "own"}}).row(ROW)["ssn"] == hashed(
        "123-45-6789", "own")



def test_an_enrichment_row_is_masked_like_the_tables_columns_of_its_names() -> None:
    masked = shaper(exclude=["note"], mask={"email": "redact"})
    assert masked.foreign({"id": 1, "email": "ann@example.com", "note": "x", "team": "a"}) == {
        "id": 1, "email": "[redacted]", "team": "a"}
