"""The subject grammar (core/subjects.py) and the name escapes it stands on (core/tokens.py): one NATS
token per name, reversible; NATS's rules for a subject; which stream patterns capture which subjects."""

from __future__ import annotations

import re

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from core.subjects import (
    action_patterns,
    covers,
    database_root,
    database_subjects,
    subject,
    subject_problem,
    uncaptured,
)
from core.tokens import escape_token, subject_token

#: Any str, lone surrogates included: the rules are total.
any_text = st.text(st.characters(exclude_categories=()))

# -- names and subjects -------------------------------------------------------------------------------


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


@pytest.mark.parametrize(("subject", "problem"), [
    ("wf.app.x", None),
    ("wf.app.café.Order/Items$1", None),
    ("wf.a*b.c>d", None),  # a wildcard only as a whole token
    ("x" * 1024, None),
    ("x" * 1025, "longer than 1024 bytes"),
    ("é" * 513, "longer than 1024 bytes"),
    ("", "it is empty"),
    ("wf..x", "empty token"),
    (".wf", "empty token"),
    ("wf.", "empty token"),
    ("wf.*", "wildcard token"),
    ("wf.>", "wildcard token"),
    ("wf.a b", "whitespace or a control character"),
    ("wf.a\tb", "whitespace or a control character"),
    ("wf.a\u00a0b", "whitespace or a control character"),
    ("wf.a\x00b", "whitespace or a control character"),
    ("wf.a\udc80", "whitespace or a control character"),
    ("$SYS.x", "NATS's own"),
])
def test_subject_problems_by_natss_rules(subject: str, problem: str | None) -> None:
    found = subject_problem(subject)
    assert found is None if problem is None else problem in (found or "")


def test_a_databases_subjects_escape_its_name_once() -> None:
    assert database_root("wf", "my db") == "wf.my%20db."
    assert database_subjects("wf", "my db") == "wf.my%20db.>"
    assert action_patterns("wf", "a.b") == ["wf.a%2Eb.*.*.insert", "wf.a%2Eb.*.*.update", "wf.a%2Eb.*.*.delete",
                                            "wf.a%2Eb.*.*.read"]
    assert subject("wf", "my db", "public", "t", "insert").startswith(database_root("wf", "my db"))


def test_subject_coverage() -> None:
    assert covers("walflow.>", "walflow.app.>")
    assert covers(">", "walflow.app.>")
    assert covers("walflow.*.>", "walflow.app.>")
    assert covers("walflow.app.>", "walflow.app.>")
    assert not covers("walflow.other.>", "walflow.app.>")
    assert not covers("walflow.app.*", "walflow.app.>")
    assert not covers("sequin.>", "walflow.app.>")


def test_the_sinks_subjects_are_one_pattern_per_action() -> None:
    assert uncaptured(["sequin.>"], "sequin", "app") == []
    assert uncaptured(["sequin.app.*.*.*"], "sequin", "app") == []
    assert uncaptured([f"sequin.app.*.*.{a}" for a in ("insert", "update", "delete", "read")], "sequin", "app") == []
    assert uncaptured(["sequin.app.*.*.insert", "sequin.app.*.*.update"], "sequin", "app") == [
        "sequin.app.*.*.delete", "sequin.app.*.*.read"]
    assert len(uncaptured(["sequin.app.public.orders.*"], "sequin", "app")) == 4
    assert len(uncaptured(["sequin.crm.>"], "sequin", "app")) == 4
    assert uncaptured(["sequin.a%20b.>"], "sequin", "a b") == []  # the database's name escaped, as published
