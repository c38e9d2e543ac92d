"""Structured, quiet logs: one line per event, warnings and up unless asked.

Two formats (``walflow.log_format``): ``text``, one ``key=value`` line for people reading a
terminal or ``journalctl``, and ``json``, one JSON object per line for log shippers. Both
carry the same fields: the time (ISO 8601, UTC), the level, the logger, the message, the
traceback of an exception when there is one, and whatever the code passes as ``extra=``.

Quiet when all is well: nothing is logged per change at ``info``, only what an operator
may want to know (a connection made or lost, a stream created, a backfill's progress).

The config file says which format to use, and loading it may already warn (ignored Sequin
keys). :func:`held_until_configured` keeps those records until :func:`configure_logging`
knows the format, so that a ``json`` pipeline writes no line that is not JSON.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Literal

LogFormat = Literal["text", "json"]

#: What every LogRecord has; anything else on a record came from ``extra=``.
_RECORD_ATTRIBUTES = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


def _extras(record: logging.LogRecord) -> dict[str, Any]:
    """The structured fields the caller passed with ``extra=``."""
    return {key: value for key, value in vars(record).items() if key not in _RECORD_ATTRIBUTES}


class _UtcFormatter(logging.Formatter):
    """Timestamps in UTC with milliseconds (``2026-12-01T10:00:00.123Z``), whatever the host's zone."""

    def __init__(self) -> None:
        super().__init__()
        self.converter = time.gmtime

    def timestamp(self, record: logging.LogRecord) -> str:
        return f"{self.formatTime(record, '%Y-%m-%dT%H:%M:%S')}.{int(record.msecs):03d}Z"


class LogfmtFormatter(_UtcFormatter):
    """``ts=… level=… logger=… msg="…"``, then each extra as ``key=value`` and ``error="…"``."""

    def format(self, record: logging.LogRecord) -> str:
        line = (
            f"ts={self.timestamp(record)} level={record.levelname.lower()} logger={record.name} "
            f"msg={json.dumps(record.getMessage())}"
        )
        for key, value in _extras(record).items():
            line += f" {key}={json.dumps(value, default=str)}"
        if record.exc_info:
            line += f" error={json.dumps(self.formatException(record.exc_info))}"
        return line


class JsonFormatter(_UtcFormatter):
    """``{"time": …, "level": …, "logger": …, "message": …, <extras>, "error": …}`` on one line.

    An extra never replaces one of the four base fields (a caller's ``extra={"level": …}``
    must not make a warning look like something else); values JSON cannot hold are written
    as their ``str()``, so a record is never lost to its formatting.
    """

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": self.timestamp(record),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in _extras(record).items():
            entry.setdefault(key, value)
        if record.exc_info:
            entry["error"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)  # ASCII: valid JSON whatever stderr's encoding


_FORMATTERS: dict[str, type[logging.Formatter]] = {"text": LogfmtFormatter, "json": JsonFormatter}


class _Held(logging.Handler):
    """Keeps every record until the format is known (:func:`held_until_configured`)."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def configure_logging(level: str, log_format: LogFormat = "text") -> None:
    """Send walflow's logs to stderr at ``level`` in ``log_format``; other libraries speak from
    WARNING up. Records held by :func:`held_until_configured` are written now, in that format.

    Python's ``warnings`` become log records too: printed as they are, they would be two
    lines of another shape.
    """
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_FORMATTERS[log_format]())
    root = logging.getLogger()
    held = [record for old in root.handlers if isinstance(old, _Held) for record in old.records]
    root.handlers[:] = [handler]
    root.setLevel(logging.WARNING)
    logging.getLogger("walflow").setLevel(level.upper())
    logging.captureWarnings(True)
    for record in held:
        if logging.getLogger(record.name).isEnabledFor(record.levelno):
            handler.handle(record)


@contextmanager
def held_until_configured() -> Iterator[None]:
    """Hold log records until :func:`configure_logging` is called inside the block.

    If the block ends without it (the config could not be loaded), what was held is written
    as ``text``, before the error that ended the block is reported.
    """
    root = logging.getLogger()
    root.handlers[:] = [_Held()]
    try:
        yield
    finally:
        if any(isinstance(handler, _Held) for handler in root.handlers):
            configure_logging("info")
