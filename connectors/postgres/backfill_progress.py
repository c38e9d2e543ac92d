"""How far each backfill is: the figures ``walflow status`` and ``/readyz`` show, a terminal's
progress line (one line, rewritten after every chunk, the running tables side by side), and
a log line per backfill every minute."""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterable
from typing import Final

from connectors.postgres.backfill_protocol import Entry

log = logging.getLogger("walflow.backfill")

#: How often a running backfill's progress is logged (seconds).
_LOG_EVERY: Final = 60.0


def figures(entries: Iterable[Entry], now: float) -> list[dict[str, object]]:
    """Each backfill's figures: id, sink, table, state (running or waiting), rows, estimate,
    rows_per_s, eta_s (None: not known)."""
    out: list[dict[str, object]] = []
    for entry in entries:
        elapsed = now - entry.started
        rate = entry.rows / elapsed if elapsed > 0 and entry.running else 0.0
        remaining = max(entry.estimate - entry.rows, 0)
        out.append({
            "id": entry.request.id, "sink": entry.request.sink, "table": entry.request.table,
            "state": "running" if entry.running else "waiting",
            "rows": entry.rows, "estimate": entry.estimate, "rows_per_s": round(rate, 1),
            "eta_s": round(remaining / rate, 1) if rate > 0 and entry.estimate else None,
        })
    return out


def progress_text(p: dict[str, object]) -> str:
    """One backfill's figures in words: ``table → sink: rows/~estimate rows, rate rows/s, ETA``."""
    estimate = p["estimate"]
    done = f"{p['rows']:,}" + (f"/~{estimate:,}" if estimate else "")
    eta = f", ETA {p['eta_s']:.0f}s" if p["eta_s"] is not None else ""
    return f"{p['table']} → {p['sink']}: {done} rows, {p['rows_per_s']:,.0f} rows/s{eta}"


class ProgressReport:
    """Where the figures are shown: the terminal line (``line``: stderr is a terminal) and the log."""

    def __init__(self, line: bool | None = None) -> None:
        self._line = sys.stderr.isatty() if line is None else line
        #: When each backfill's progress was last logged, by id.
        self._logged: dict[str, float] = {}

    def started(self, backfill: str, now: float) -> None:
        self._logged[backfill] = now

    def chunk_read(self, backfill: str, progress: list[dict[str, object]], now: float) -> None:
        """After a chunk of ``backfill``: the terminal line, and its log line once a minute."""
        if self._line:
            line = "  ".join(progress_text(p) for p in progress if p["state"] == "running")
            sys.stderr.write(f"\r\x1b[Kbackfill {line}")
            sys.stderr.flush()
        if now - self._logged.setdefault(backfill, now) >= _LOG_EVERY:
            self._logged[backfill] = now
            for p in progress:
                if p["id"] == backfill:
                    log.info("backfill %s: %s", backfill, progress_text(p))

    def close(self) -> None:
        if self._line:
            sys.stderr.write("\n")
