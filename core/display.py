"""What walflow shows people: URLs without their credentials, text without control characters.

A URL may carry credentials (``nats://user:password@host:4222``, a token as its user) or
more in its path and query: walflow prints one as :func:`display_url` makes it,
``scheme://host:port``, wherever it prints it (logs, errors, ``walflow check`` and
``status``, their ``--json``, metric labels).

Names that reach the terminal come from the database and from NATS (tables, columns,
streams, a server's error text), and anyone who can create a table chooses its name: one
holding ``ESC [`` would move the cursor, rewrite earlier lines or set the window title of
whoever reads ``walflow check``. :func:`printable` escapes every character a terminal would
act on. JSON outputs need nothing more (``json.dumps`` escapes them), nor do the log lines,
whose text format writes each value as JSON too.
"""

from __future__ import annotations

import re
from typing import Final

#: Where a URL's network location ends.
_AFTER_HOST: Final = re.compile(r"[/?#]")


def display_url(url: str) -> str:
    """``url`` as walflow prints it: ``scheme://host:port`` (as written, the port only if given),
    without the user, password or token before an ``@`` and without path, query or fragment.

    A password holding an unencoded ``/``, ``?`` or ``#`` would end the network location early
    for a URL parser and leave its tail before the ``@``: the host is taken after the last
    ``@`` of the URL, so no part of such a password is shown either."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    host = _AFTER_HOST.split(rest.rpartition("@")[2], maxsplit=1)[0]
    return f"{scheme}://{host}" if sep else host


def printable(text: str, keep: str = "") -> str:
    """``text`` with every character that is not printable (control characters such as ESC,
    DEL and the C1 set, line and paragraph separators, bidirectional and other format
    characters, unassigned code points) written as its escape, ``\\x1b`` or ``\\u202e``, as
    Python's ``repr`` writes it. The characters of ``keep`` (a fatal error's newlines) pass."""
    if text.isprintable():
        return text
    return "".join(char if char.isprintable() or char in keep else _escape(char) for char in text)


def fatal_line(exc: BaseException) -> str:
    """The one ``walflow: …`` line a fatal error stops a command with (a config error's problems
    on lines of their own, a driver's hint indented below), escaped as :func:`printable` but for
    those line breaks and tabs."""
    return "walflow: " + printable(str(exc), keep="\n\t")


def _escape(char: str) -> str:
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"
