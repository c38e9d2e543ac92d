"""Warnings said once per process: the first time a process meets something, never again.

A condition that holds on every row (a value that falls back to its text) or every
connection (a database whose TLS does not verify the server) is said in one line; a
second line would say nothing new, and a thousand would bury the log.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import Final

#: What :func:`warn_once` warned of in this process (every thread's), at most this many:
#: names anyone may create (tables) must not grow memory without bound.
_warned: set[tuple[str, ...]] = set()
_warned_lock = threading.Lock()
_MAX_WARNED: Final = 10_000


def warn_once(logger: logging.Logger, what: tuple[str, ...], message: str, *args: object,
              extra: Mapping[str, object] | None = None) -> None:
    """Log ``message`` (``%`` ``args``, with the structured fields ``extra``) on ``logger`` as a
    warning the first time this process meets ``what`` (a table and column, say), and never
    again. The message must name no value of a row, nor a secret."""
    with _warned_lock:
        if what in _warned or len(_warned) >= _MAX_WARNED:
            return
        _warned.add(what)
    logger.warning(message, *args, extra=extra)
