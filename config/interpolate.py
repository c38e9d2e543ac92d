"""Environment references in config values, as Sequin resolves them (envsubst on parsed strings).

Sequin's CLI parses the YAML first and substitutes in string values only. walflow does the
same in two steps, so that the parse cannot be broken by a value nor a reference by YAML:
``Marked`` swaps every ``$`` construct in the text for a placeholder that YAML keeps as it is
(plain, quoted, in a block or in a flow mapping), and ``Marked.resolve`` puts the values into
the parsed strings. Hence a value may hold any YAML syntax (``#``, ``: ``, quotes); references
in comments are never looked up, nor those under keys the loader drops (``users:`` …); keys
are not interpolated (as in Sequin).

Forms, with shell rules:

- ``${VAR}`` and ``$VAR``: the value; VAR unset is an error (Sequin's envsubst would write an
  empty string: a silent empty password helps nobody).
- ``${VAR:-x}`` / ``${VAR:=x}``: ``x`` when VAR is unset or empty; ``${VAR-x}`` / ``${VAR=x}``:
  ``x`` when VAR is unset (nothing is assigned).
- ``${VAR:+x}``: ``x`` when VAR is set and not empty, else empty; ``${VAR+x}``: ``x`` when VAR is
  set.
- Before a reference, ``$$`` writes a literal ``$`` (``$${A}`` is ``${A}``, ``$$A`` is ``$A``,
  ``$$$A`` is ``$`` and A's value); any other ``$`` is itself (``$5``, ``$$`` at the end).

A resolved value is a string, as in Sequin; the schema reads numbers and booleans from it
(``port: ${PGPORT:-5432}``). A value that comes out empty is null, as Sequin's Ecto reads it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_BRACED = re.compile(rf"\$\{{(?P<name>{_NAME})(?:(?P<op>:-|-|:=|=|:\+|\+)(?P<word>[^}}\n]*))?\}}")
_BARE = re.compile(rf"\$(?P<name>{_NAME})")
_STARTS_REFERENCE = re.compile(r"[{A-Za-z_]")
#: Private-use characters around a token's index: YAML passes them through anywhere.
_OPEN, _CLOSE = "\ue000", "\ue001"
_PLACEHOLDER = re.compile(f"{_OPEN}([0-9]+){_CLOSE}")


#: Why a secret's value does not resolve, without a word of the value.
_SECRET_PROBLEM = (
    "holds a '$' that does not resolve (the value is a secret: it is not shown): a variable that is not set, or a "
    "'$' that starts no valid reference; write $$ for each literal $, and ${NAME} for a variable"
)


class InterpolationError(ValueError):
    """A reference that cannot be resolved (the message says why and what to write)."""


@dataclass(frozen=True, slots=True)
class _Token:
    """One ``$`` construct of the text: a reference, an escaped ``$``, or a malformed reference."""

    raw: str
    name: str | None = None
    op: str | None = None
    word: str = ""
    #: Set for a malformed reference: raised when a value that holds it is resolved.
    problem: str | None = None

    def value(self, env: Mapping[str, str]) -> str:
        if self.problem is not None:
            raise InterpolationError(self.problem)
        if self.name is None:
            return "$" * (len(self.raw) // 2)
        value = env.get(self.name)
        if self.op is None:
            if value is None:
                default = f"give a default with ${{{self.name}:-value}}"
                fixes = (f"export {self.name}, or {default}" if self.raw.startswith("${")
                         else f"export {self.name}, {default}, or write ${self.raw} for a literal {self.raw}")
                raise InterpolationError(f"{self.raw} is not set: {fixes}")
            return value
        if self.op in (":-", ":="):
            return value if value else self.word
        if self.op in ("-", "="):
            return value if value is not None else self.word
        if self.op == ":+":
            return self.word if value else ""
        return self.word if value is not None else ""  # "+"


class Marked:
    """A config text with its references replaced by placeholders (``text``), and the way back."""

    def __init__(self, text: str) -> None:
        if _OPEN in text or _CLOSE in text:
            raise InterpolationError(
                "the file holds U+E000 or U+E001, private-use characters that walflow uses to mark references; "
                "remove them"
            )
        self._source = text
        self._tokens: list[_Token] = []
        #: (where a placeholder starts in ``text``, how much longer the file's text is than it)
        self._shifts: list[tuple[int, int]] = []
        out: list[str] = []
        length = 0  # of ``out`` so far
        pos = 0
        while (start := text.find("$", pos)) != -1:
            token, end = _scan(text, start)
            if token is None:
                piece = text[pos:end]
            else:
                placeholder = f"{_OPEN}{len(self._tokens)}{_CLOSE}"
                self._shifts.append((length + start - pos, len(token.raw) - len(placeholder)))
                self._tokens.append(token)
                piece = text[pos:start] + placeholder
            out.append(piece)
            length += len(piece)
            pos = end
        out.append(text[pos:])
        self.text = "".join(out)

    def resolve(self, value: str, env: Mapping[str, str], *, secret: bool = False) -> str | None:
        """``value`` (a parsed string) with its references resolved; None if that leaves it empty.

        ``secret``: the value may be a secret, so an error does not quote it. A ``$`` in a
        password (``pa$word``) reads as a reference; its message would show what follows it.
        Only a value that is one ``${NAME}`` and nothing else is named, being no secret itself."""
        if _OPEN not in value:
            return value
        try:
            resolved = _PLACEHOLDER.sub(lambda m: self._tokens[int(m.group(1))].value(env), value)
        except InterpolationError:
            whole = _PLACEHOLDER.fullmatch(value)
            token = self._tokens[int(whole.group(1))] if whole is not None else None
            if not secret or (token is not None and token.raw.startswith("${") and token.problem is None):
                raise
            raise InterpolationError(_SECRET_PROBLEM) from None
        return resolved or None

    def position(self, index: int) -> tuple[int, int]:
        """Line and column (from 1) in the file of the character at ``index`` in ``text``."""
        index += sum(shift for start, shift in self._shifts if start < index)
        line_start = self._source.rfind("\n", 0, index) + 1
        return self._source.count("\n", 0, index) + 1, index - line_start + 1

    def restore(self, value: str) -> str:
        """``value`` as the file wrote it: for keys, which are not interpolated."""
        return _PLACEHOLDER.sub(lambda m: self._tokens[int(m.group(1))].raw, value)


def _scan(text: str, start: int) -> tuple[_Token | None, int]:
    """The construct at the ``$`` at ``start`` (None: a plain ``$``) and where the text continues."""
    after = start  # where the dollars from start end
    while after < len(text) and text[after] == "$":
        after += 1
    if after - start > 1:
        if not _STARTS_REFERENCE.match(text, after):
            return None, after
        pairs = (after - start) // 2  # each $$ is a literal $; an odd one left starts the reference
        return _Token("$$" * pairs), start + 2 * pairs
    following = text[start + 1:start + 2]
    if following == "{":
        ref = _BRACED.match(text, start)
        if ref is not None:
            return _Token(ref.group(), ref.group("name"), ref.group("op"), ref.group("word") or ""), ref.end()
        return _malformed(text, start)
    ref = _BARE.match(text, start)
    if ref is not None:
        return _Token(ref.group(), ref.group("name")), ref.end()
    return None, start + 1


def _malformed(text: str, start: int) -> tuple[_Token, int]:
    """A ``${`` that is no reference; it takes the rest of the reference with it, up to its ``}``."""
    end = text.find("}", start)
    newline = text.find("\n", start)
    if end == -1 or (newline != -1 and newline < end):
        problem = f"'{text[start:start + 20].splitlines()[0]}' has no closing '}}'"
        return _Token(text[start:start + 2], problem=problem), start + 2
    raw = text[start:end + 1]
    return _Token(raw, problem=(
        f"'{raw}' is not a valid reference: write ${{NAME}}, ${{NAME:-default}} or $NAME "
        "(NAME: letters, digits and underscores, not starting with a digit); write $${ for a literal ${"
    )), end + 1
