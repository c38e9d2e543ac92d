"""Subjects: one NATS token per name, by core.tokens' reversible escapes; no servers."""

from __future__ import annotations

import re

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from core.tokens import escape_token, subject_token
from transforms.route import subject

#: Any str, lone surrogates included: the rules are total.
any_text = st.text(st.characters(exclude_categories=()))

# -- subjects -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "token"),
    [
        ("orders", "orders"),
        ("Order_Items-2", "Order_Items-2"),
        ("my.table", "my%2Etable"),
        ("a b", "a%20b"),
        ("tab\there", "tab%09here"),
        ("*", "%2A"),
        (">", "%3E"),
        ("100%", "100%25"),
        ("%2E", "%252E"),  # a literal '%2E' cannot pass for an escaped '.'
        ("café", "caf%C3%A9"),
        ("日本", "%E6%97%A5%E6%9C%AC"),
        ("", "%"),
        ("\udc80", "%ED%B2%80"),  # a lone surrogate (no Postgres name has one): still a distinct token
    ],
)
def test_escape_token(name: str, token: str) -> None:
    assert escape_token(name) == token


@pytest.mark.parametrize(
    ("name", "token"),
    [
        ("orders", "orders"),
        ("café", "café"),  # NATS carries it, Sequin publishes it so: unchanged
        ("日本", "日本"),
        ("Order/Items$1:@#~+", "Order/Items$1:@#~+"),
        ("my.table", "my%2Etable"),
        ("a b", "a%20b"),
        ("tab\there", "tab%09here"),
        ("no\u00a0break", "no%C2%A0break"),  # Unicode whitespace too
        ("bell\x07", "bell%07"),
        ("*", "%2A"),
        (">", "%3E"),
        ("100%", "100%25"),
        ("%2E", "%252E"),
        ("", "%"),
        ("\udc80", "%ED%B2%80"),
    ],
)
def test_subject_token_escapes_only_what_a_token_cannot_hold(name: str, token: str) -> None:
    assert subject_token(name) == token


@given(any_text)
def test_subject_tokens_are_valid_and_reversible(name: str) -> None:
    token = subject_token(name)
    assert token and not any(c in ".*>" or c.isspace() or not c.isprintable() for c in token), token
    assert _unescape(token) == name


@given(any_text, any_text)
def test_subject_tokens_are_injective(a: str, b: str) -> None:
    assume(a != b)
    assert subject_token(a) != subject_token(b)


def test_subject_uses_prefix_database_and_escaped_names() -> None:
    assert subject("sequin", "app", "Sales", "line.items", "delete") == "sequin.app.Sales.line%2Eitems.delete"


def test_subject_is_prefix_database_schema_table_action() -> None:
    assert subject("walflow", "app", "public", "orders", "insert") == "walflow.app.public.orders.insert"
    assert subject("sequin", "app", "public", "orders", "delete") == "sequin.app.public.orders.delete"
    assert subject("a.b", "my db", "Sales.EU", "line items", "update") == "a.b.my%20db.Sales%2EEU.line%20items.update"


def _unescape(token: str) -> str:
    """Percent-decoding, as a consumer would do it: the inverse of both escapes."""
    if token == "%":
        return ""
    out, i = bytearray(), 0
    while i < len(token):
        if token[i] == "%":
            out.append(int(token[i + 1:i + 3], 16))
            i += 3
        else:
            out += token[i].encode()
            i += 1
    return out.decode("utf-8", "surrogatepass")


@given(any_text)
def test_escaped_tokens_are_valid_nats_tokens_and_reversible(name: str) -> None:
    token = escape_token(name)
    assert token
    assert re.fullmatch(r"[A-Za-z0-9_%-]+", token), token  # so no '.', '*', '>' or whitespace
    assert _unescape(token) == name


@given(any_text, any_text)
def test_escaping_is_injective(a: str, b: str) -> None:
    assume(a != b)
    assert escape_token(a) != escape_token(b)


@given(st.lists(st.text(), min_size=3, max_size=3))
def test_subject_has_one_token_per_name(names: list[str]) -> None:
    database, schema, table = names
    tokens = subject("walflow", database, schema, table, "insert").split(".")
    assert [_unescape(t) for t in tokens] == ["walflow", database, schema, table, "insert"]
