"""Properties of environment references (hypothesis) and their edge cases."""

from __future__ import annotations

import re

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from config.interpolate import InterpolationError, Marked

names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,15}", fullmatch=True)
#: Any text but the two private-use characters that mark references.
chars = st.characters(blacklist_characters="\ue000\ue001")
values = st.text(chars, max_size=30)
words = st.text(st.characters(blacklist_characters="}\n\ue000\ue001"), max_size=20)
plain = st.text(chars, max_size=60)


def interpolate(text: str, env: dict[str, str]) -> str:
    """``text`` resolved as one value (an empty result as "", not null)."""
    marked = Marked(text)
    return marked.resolve(marked.text, env) or ""


def escape(text: str) -> str:
    """``text`` written so that it resolves to itself: its dollars doubled before what would start a reference."""
    return re.sub(r"\$+(?=[{A-Za-z_])", lambda run: run.group() * 2, text)


@given(plain)
def test_text_without_references_is_unchanged(text: str) -> None:
    assert interpolate(escape(text), {}) == text


@given(names, values)
def test_set_variable_is_substituted(name: str, value: str) -> None:
    assert interpolate(f"a ${{{name}}} b", {name: value}) == f"a {value} b"
    assert interpolate(f"a ${name} b", {name: value}) == f"a {value} b"


@given(names, values.filter(bool), words)
def test_defaults_and_alternatives_follow_the_shell(name: str, value: str, word: str) -> None:
    def results(op: str) -> tuple[str, str, str]:
        """The reference with ``op`` when the variable is set, set but empty, and unset."""
        ref = f"${{{name}{op}{word}}}"
        return interpolate(ref, {name: value}), interpolate(ref, {name: ""}), interpolate(ref, {})

    assert results(":-") == results(":=") == (value, word, word)  # unset or empty
    assert results("-") == results("=") == (value, "", word)  # unset only
    assert results(":+") == (word, "", "")  # set and not empty
    assert results("+") == (word, word, "")  # set


@given(names, values)
def test_values_are_not_interpolated_again(name: str, value: str) -> None:
    """A value that itself contains ``${X}`` stays literal: one pass, no injection."""
    nested = f"${{OTHER}}$OTHER{value}"
    assert interpolate(f"${{{name}}}", {name: nested}) == nested


@given(st.lists(st.tuples(plain, names), max_size=5), plain, st.dictionaries(names, values))
def test_references_resolve_independently(parts: list[tuple[str, str]], tail: str, env: dict[str, str]) -> None:
    """Interpolating a concatenation equals concatenating the interpolated pieces."""
    env = {**env, **{name: env.get(name, name.lower()) for _, name in parts}}
    pieces = [(escape(text) + "|", f"${{{name}}}") for text, name in parts]
    whole = "".join(t + r for t, r in pieces) + escape(tail)
    expected = "".join(interpolate(t, env) + env[n] for (t, _), (_, n) in zip(pieces, parts, strict=True)) + tail
    assert interpolate(whole, env) == expected


@given(names)
def test_unset_variable_is_an_error_that_says_what_to_do(name: str) -> None:
    message = f"${{{name}}} is not set: export {name}, or give a default"
    with pytest.raises(InterpolationError, match=re.escape(message)):
        interpolate(f"x ${{{name}}}", {})
    with pytest.raises(InterpolationError, match=re.escape(f"write $${name} for a literal ${name}")):
        interpolate(f"x ${name}", {})


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("${}", "'${}' is not a valid reference"),
        ("${1A}", "'${1A}' is not a valid reference"),
        ("${A B}", "'${A B}' is not a valid reference"),
        ("${A:default}", "'${A:default}' is not a valid reference"),
        ("${A.B}", "'${A.B}' is not a valid reference"),
        ("${A", "'${A' has no closing '}'"),
        ("${A:-x\n}", "'${A:-x' has no closing '}'"),
    ],
)
def test_malformed_references_are_errors(text: str, message: str) -> None:
    with pytest.raises(InterpolationError, match=re.escape(message)):
        interpolate(f"x: {text}", {"A": "1"})


def test_lone_dollars_and_escapes() -> None:
    assert interpolate("cost: $5 {a} $ {b} $$ $-", {}) == "cost: $5 {a} $ {b} $$ $-"
    assert interpolate("$$A $${A} $$$A $$$$A", {"A": "1"}) == "$A ${A} $1 $$A"


def test_a_malformed_reference_is_only_an_error_where_it_is_used() -> None:
    marked = Marked("a: ${A\nb: ok\n")
    assert marked.resolve("ok", {}) == "ok"
    with pytest.raises(InterpolationError):
        marked.resolve(yaml.safe_load(marked.text)["a"], {})


@pytest.mark.parametrize(
    "document",
    [
        "k: ${V}",
        "k: '${V}'",
        'k: "${V}"',
        "k: |-\n  ${V}",
        "k: {a: ${V}, b: 1}",
        "k: [${V}, 1]",
        "k: $V",
    ],
    ids=["plain", "single-quoted", "double-quoted", "block", "flow-mapping", "flow-sequence", "bare"],
)
def test_any_value_survives_yaml_in_any_style(document: str) -> None:
    """The value is put in after parsing: YAML syntax in it stays text."""
    value = "a: b, #c [d] {e} 'f' \"g\\n\" *h &i"
    marked = Marked(document)
    k = yaml.safe_load(marked.text)["k"]
    node = k if isinstance(k, str) else k["a"] if isinstance(k, dict) else k[0]
    assert marked.resolve(node, {"V": value}) == value


def test_keys_keep_their_text_and_an_empty_value_is_null() -> None:
    marked = Marked("${K}: ${E:-}\n")
    [(key, value)] = yaml.safe_load(marked.text).items()
    assert marked.restore(key) == "${K}"
    assert marked.resolve(value, {}) is None


def test_positions_are_those_of_the_file() -> None:
    text = "a: ${LONG_NAME:-default} $$X\nb: [${Q}"
    marked = Marked(text)
    assert marked.position(marked.text.index("b")) == (2, 1)
    assert marked.position(len(marked.text)) == (2, len("b: [${Q}") + 1)
    assert marked.position(marked.text.index("X")) == (1, text.index("X") + 1)


def test_private_use_markers_in_the_file_are_refused() -> None:
    with pytest.raises(InterpolationError, match="U\\+E000"):
        Marked("a: \ue000")
