"""Properties of ``${VAR}`` interpolation (hypothesis) and its edge cases."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from config.interpolate import InterpolationError, interpolate

names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,15}", fullmatch=True)
values = st.text(max_size=30)
defaults = st.text(alphabet=st.characters(blacklist_characters="}"), max_size=20)
plain = st.text(max_size=60)


@given(plain)
def test_text_without_references_is_unchanged(text: str) -> None:
    escaped = text.replace("${", "$${")
    assert interpolate(escaped, {}) == text


@given(names, values)
def test_set_variable_is_substituted(name: str, value: str) -> None:
    assert interpolate(f"a ${{{name}}} b", {name: value}) == f"a {value} b"


@given(names, values.filter(bool), defaults)
def test_default_is_used_only_when_unset_or_empty(name: str, value: str, default: str) -> None:
    ref = f"${{{name}:-{default}}}"
    assert interpolate(ref, {name: value}) == value
    assert interpolate(ref, {name: ""}) == default
    assert interpolate(ref, {}) == default


@given(names, values)
def test_values_are_not_interpolated_again(name: str, value: str) -> None:
    """A value that itself contains ``${X}`` stays literal: one pass, no injection."""
    nested = f"${{OTHER}}{value}"
    assert interpolate(f"${{{name}}}", {name: nested}) == nested


@given(st.lists(st.tuples(plain, names), max_size=5), plain, st.dictionaries(names, values))
def test_references_resolve_independently(parts: list[tuple[str, str]], tail: str, env: dict[str, str]) -> None:
    """Interpolating a concatenation equals concatenating the interpolated pieces."""
    env = {**env, **{name: env.get(name, name.lower()) for _, name in parts}}
    pieces = [(text.replace("${", "$${") + "|", f"${{{name}}}") for text, name in parts]
    whole = "".join(t + r for t, r in pieces) + tail.replace("${", "$${")
    expected = "".join(interpolate(t, env) + env[n] for (t, _), (_, n) in zip(pieces, parts, strict=True)) + tail
    assert interpolate(whole, env) == expected


@given(names)
def test_unset_variable_is_an_error_at_its_offset(name: str) -> None:
    text = f"key: x\nother: ${{{name}}}\n"
    with pytest.raises(InterpolationError) as info:
        interpolate(text, {})
    assert info.value.offset == text.index("$")
    assert f"export {name}" in str(info.value)


@pytest.mark.parametrize("text", ["${}", "${1A}", "${A B}", "${A:default}", "${A", "${A-b}"])
def test_malformed_references_are_errors(text: str) -> None:
    with pytest.raises(InterpolationError) as info:
        interpolate(f"x: {text}", {"A": "1"})
    assert info.value.offset == 3


def test_lone_dollars_and_braces_pass_through() -> None:
    assert interpolate("cost: $5 {a} $ {b} $$", {}) == "cost: $5 {a} $ {b} $$"
