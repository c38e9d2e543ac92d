"""A sink's ``initial_backfill``: requested once, when the sink is first started.

"First started" is remembered where the sink lives: the ``walflow_state`` key-value bucket
on its NATS (:class:`connectors.nats.state.SinkMemory`), written
after the requests are in the slot. A crash between the two asks again on the next start
(a second backfill, harmless: the stream still ends with each row's latest state); the
other order could lose the backfill. Runs in the one process that reads the slot, when
its source partition is built: a cluster asks once.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from config.schema import BackfillSettings, DatabaseConfig, SinkConfig
from connectors.nats.state import SinkMemory
from connectors.postgres.requests import BackfillRequestError, keyless_refusal, publication_tables, request_backfills
from connectors.postgres.signals import BackfillRequest, signing_key
from transforms.filter import SinkFilter

log = logging.getLogger("walflow.backfill")


class InitialBackfills:
    """Requests the initial backfills of ``sinks`` that no earlier run requested."""

    def __init__(self, db: DatabaseConfig, sinks: list[SinkConfig], memories: Mapping[str, SinkMemory],
                 settings: BackfillSettings) -> None:
        """``memories``: what each sink remembers, by sink name."""
        self.db = db
        self.settings = settings
        self.sinks = [s for s in sinks if s.initial_backfill]
        self.memories = memories

    def __call__(self) -> None:
        pending = [s for s in self.sinks if not self.memories[s.name].initial_backfill_requested()]
        if not pending:
            return
        published, keyless = publication_tables(self.db)
        for sink in pending:
            requests = self._requests(sink, published, keyless)
            if len(requests) > self.settings.max_pending:
                raise BackfillRequestError(
                    f"sink '{sink.name}': initial_backfill asks for {len(requests)} tables, more than the "
                    f"{self.settings.max_pending} backfills a sink may have pending: set walflow.backfill.max_pending "
                    f"to at least {len(requests)}"
                )
            request_backfills(self.db, requests, signing_key(self.settings))
            self.memories[sink.name].record_initial_backfill([r.id for r in requests])
            log.info("sink %s: initial backfill of %d table(s) requested: %s", sink.name, len(requests),
                     ", ".join(f"{r.table} ({r.id})" for r in requests) or "none")

    @staticmethod
    def _requests(sink: SinkConfig, published: list[str], keyless: set[str]) -> list[BackfillRequest]:
        """``true``: every table the sink reads, except those without a key (a warning each:
        the pipeline still streams their changes); a list: as listed (a keyless one is refused)."""
        if sink.initial_backfill is True:
            receives = SinkFilter(sink).receives
            tables = [t for t in published if receives(t.partition(".")[0], t)]
            for table in tables:
                if table in keyless:
                    log.warning("sink %s: initial backfill skips %s: %s", sink.name, table, keyless_refusal(table))
            return [BackfillRequest.new(sink.name, t) for t in tables if t not in keyless]
        assert isinstance(sink.initial_backfill, list)
        receives = SinkFilter(sink).receives
        for entry in sink.initial_backfill:
            if not receives(entry.table.partition(".")[0], entry.table):
                raise BackfillRequestError(
                    f"sink '{sink.name}': initial_backfill names {entry.table}, which the sink does not read "
                    "(see its source: and table:); its changes would never follow its rows"
                )
        return [BackfillRequest.new(sink.name, b.table, b.sort_column, b.start_position) for b in sink.initial_backfill]
