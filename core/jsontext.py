"""Whether a text is JSON, at any depth: for a text no Postgres output function printed.

A json or jsonb column's text is JSON by construction (Postgres's output functions print
nothing else), so :func:`connectors.postgres.types.json_loads` carries one nested deeper than
Python's values go as a :class:`core.events.JsonText` without checking it. A transaction's
annotations are any text a database role writes (``pg_logical_emit_message``), and a JSON
parser recursing per level cannot check a deep one (orjson reads 1,024 levels, ``json`` about
1,000): :func:`is_json` does, with regular expressions and a loop with a stack of its own,
so nothing walflow embeds in a message can break its JSON.
"""

from __future__ import annotations

import re
from typing import Final

#: Control characters JSON allows nowhere unescaped (tab, LF and CR only as whitespace).
_CONTROL: Final = re.compile(rb"[\x00-\x08\x0b\x0c\x0e-\x1f]")
_STRING: Final = re.compile(rb'"(?:[^"\\\x00-\x1f]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4})*"')
_SCALAR: Final = re.compile(rb"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?|true|false|null")
#: What a string and a number or literal become (bytes a JSON text cannot hold after _CONTROL's check).
_STRING_TOKEN: Final = 1
_SCALAR_TOKEN: Final = 2
_WHITESPACE: Final = b" \t\n\r"
_TOKENS: Final = b"[]{},:\x01\x02"
_OPEN_ARRAY, _CLOSE_ARRAY, _OPEN_OBJECT, _CLOSE_OBJECT, _COMMA, _COLON = b"[]{},:"
#: Each opening bracket's closing one; and (``_FIRST``) what it expects first besides that: a value, a key.
_CLOSING: Final = {_OPEN_ARRAY: _CLOSE_ARRAY, _OPEN_OBJECT: _CLOSE_OBJECT}
# what the checker expects next
_VALUE, _VALUE_OR_END, _KEY, _KEY_OR_END, _COLON_NEXT, _AFTER = range(6)
_FIRST: Final = {_OPEN_ARRAY: _VALUE_OR_END, _OPEN_OBJECT: _KEY_OR_END}


def is_json(text: bytes) -> bool:
    """Whether ``text`` is one JSON text (RFC 8259: a value of any kind, whitespace around it,
    UTF-8), however deeply nested: strings, numbers and literals are reduced to one byte each
    by regular expressions, and what remains is checked by a loop with a stack of its own
    (no recursion). ``NaN``, ``Infinity``, comments, trailing commas and a BOM are not JSON."""
    try:
        text.decode("utf-8")
    except UnicodeDecodeError:
        return False
    if _CONTROL.search(text) is not None:
        return False
    reduced = _SCALAR.sub(b"\x02", _STRING.sub(b"\x01", text)).translate(None, _WHITESPACE)
    if reduced.translate(None, _TOKENS):
        return False  # anything else: a stray quote, a bare word, a lone minus
    return _well_formed(reduced)


def _well_formed(tokens: bytes) -> bool:
    """Whether ``tokens`` (:func:`is_json`'s reduction) is one value, its brackets and separators in place."""
    stack: list[int] = []
    expect = _VALUE
    for token in tokens:
        if expect in (_AFTER, _VALUE_OR_END, _KEY_OR_END):
            if stack and token == _CLOSING[stack[-1]] and expect in (_AFTER, _FIRST[stack[-1]]):
                stack.pop()
                expect = _AFTER
                continue
            if expect == _AFTER:  # a comma, inside an array or an object (a second value after the text's: no)
                if not stack or token != _COMMA:
                    return False
                expect = _VALUE if stack[-1] == _OPEN_ARRAY else _KEY
                continue
            expect = _VALUE if expect == _VALUE_OR_END else _KEY
        if expect == _KEY:
            if token != _STRING_TOKEN:
                return False
            expect = _COLON_NEXT
        elif expect == _COLON_NEXT:
            if token != _COLON:
                return False
            expect = _VALUE
        elif token in (_STRING_TOKEN, _SCALAR_TOKEN):
            expect = _AFTER
        elif token in _FIRST:
            stack.append(token)
            expect = _FIRST[token]
        else:
            return False
    return expect == _AFTER and not stack
