"""``${VAR}`` and ``${VAR:-default}`` in the config text, as Sequin does it.

Interpolation happens on the text, before YAML parsing, so ``port: ${PGPORT:-5432}`` is
an integer afterwards. Shell rules: ``${VAR:-x}`` uses ``x`` when VAR is unset *or empty*;
``${VAR}`` with VAR unset is an error (a silent empty password helps nobody). ``$${`` writes
a literal ``${``. Errors carry the offset of the bad reference so that the loader can name
the key that holds it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

_TOKEN = re.compile(r"\$\$\{|\$\{")
_REFERENCE = re.compile(r"\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?::-(?P<default>[^}]*))?\}")


class InterpolationError(ValueError):
    """A reference that cannot be resolved; ``offset`` points at its ``$`` in the text."""

    def __init__(self, message: str, offset: int) -> None:
        super().__init__(message)
        self.offset = offset


def interpolate(text: str, env: Mapping[str, str]) -> str:
    """Replace every reference in ``text`` with its value from ``env``."""
    out: list[str] = []
    pos = 0
    for token in _TOKEN.finditer(text):
        start = token.start()
        if start < pos:  # inside a reference already consumed
            continue
        out.append(text[pos:start])
        if token.group() == "$${":
            out.append("${")
            pos = token.end()
            continue
        ref = _REFERENCE.match(text, start)
        if ref is None:
            raise InterpolationError(_describe_bad_reference(text, start), start)
        name, default = ref.group("name"), ref.group("default")
        value = env.get(name)
        if default is not None and not value:
            value = default
        if value is None:
            raise InterpolationError(
                f"${{{name}}} is not set: export {name}, or give a default with ${{{name}:-value}}", start
            )
        out.append(value)
        pos = ref.end()
    out.append(text[pos:])
    return "".join(out)


def _describe_bad_reference(text: str, start: int) -> str:
    end = text.find("}", start)
    newline = text.find("\n", start)
    if end == -1 or (newline != -1 and newline < end):
        return f"'{text[start:start + 20].splitlines()[0]}' has no closing '}}'"
    return (
        f"'{text[start:end + 1]}' is not a valid reference: write ${{NAME}} or ${{NAME:-default}} "
        "(NAME: letters, digits and underscores, not starting with a digit); write $${ for a literal ${"
    )
