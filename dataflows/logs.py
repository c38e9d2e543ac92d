"""Structured, quiet logs: one ``key=value`` line per event, warnings and up unless asked."""

from __future__ import annotations

import json
import logging
import sys
import time


class _LogfmtFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__()
        self.converter = time.gmtime  # timestamps in UTC, as the Z says

    def format(self, record: logging.LogRecord) -> str:
        line = (
            f"ts={self.formatTime(record, '%Y-%m-%dT%H:%M:%S')}.{int(record.msecs):03d}Z "
            f"level={record.levelname.lower()} logger={record.name} msg={json.dumps(record.getMessage())}"
        )
        if record.exc_info:
            line += f" error={json.dumps(self.formatException(record.exc_info))}"
        return line


def configure_logging(level: str) -> None:
    """Send walflow's logs to stderr at ``level``; other libraries speak from WARNING up."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_LogfmtFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.WARNING)
    logging.getLogger("walflow").setLevel(level.upper())
