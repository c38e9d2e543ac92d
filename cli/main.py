"""``walflow``: commands beside the dataflow (``shared/CONTRACT.md``, "The walflow command").

``walflow backfill [CONFIG] --sink NAME --table SCHEMA.TABLE [--sort-column COL --start-position VALUE]``
asks the running pipeline (or the next one started) to backfill a table for a sink: the
request travels through the slot, so it is durable and ordered with the changes. It
prints the backfill's id and exits 0 once the request is written; a request that cannot
work (no such sink, a table the sink does not read or the publication does not stream)
is refused with one line and exit 2.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

import psycopg

from config import config_path, load_config
from connectors.postgres.requests import BackfillRequestError, request_backfills
from connectors.postgres.signals import BackfillRequest
from core.errors import FatalError
from core.runtime import FATAL_EXIT
from transforms.filter import SinkFilter


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="walflow", description="walflow: Postgres change data capture to NATS JetStream")
    commands = parser.add_subparsers(dest="command", required=True)
    backfill = commands.add_parser("backfill", help="backfill a table for a sink, while the pipeline runs")
    backfill.add_argument("config", nargs="?", help="the config file (default: $WALFLOW_CONFIG, then config/walflow.yaml)")
    backfill.add_argument("--sink", required=True, help="the sink that publishes the rows")
    backfill.add_argument("--table", required=True, help="the table, as schema.table")
    backfill.add_argument("--sort-column", help="partial backfill: the column that orders the rows")
    backfill.add_argument("--start-position", help="partial backfill: rows whose sort column is at or after this")
    return parser


def backfill(args: argparse.Namespace) -> str:
    """Record the request; its id."""
    config = load_config(args.config or config_path())
    sink = next((s for s in config.sinks if s.name == args.sink), None)
    if sink is None:
        raise BackfillRequestError(f"no sink named '{args.sink}' (sinks: {', '.join(s.name for s in config.sinks)})")
    if not sink.enabled:
        raise BackfillRequestError(f"sink '{sink.name}' is disabled: it would not publish the rows")
    if (args.sort_column is None) != (args.start_position is None):
        raise BackfillRequestError("a partial backfill needs both --sort-column and --start-position")
    schema, dot, _ = args.table.partition(".")
    if not dot:
        raise BackfillRequestError(f"'{args.table}' is not a qualified table name: write schema.table")
    if not SinkFilter(sink).receives(schema, args.table):
        raise BackfillRequestError(f"sink '{sink.name}' does not read {args.table} (see its source: and table:)")
    request = BackfillRequest.new(sink.name, args.table, args.sort_column, args.start_position)
    request_backfills(config.database(sink.database), [request])
    return request.id


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.ERROR)  # the pipeline's warnings (tables without a key, …) are its own
    try:
        if args.command == "backfill":
            print(backfill(args))
    except FatalError as exc:
        print(f"walflow: {exc}", file=sys.stderr)
        return FATAL_EXIT
    except psycopg.OperationalError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(f"walflow: cannot reach the database: {first}", file=sys.stderr)
        return FATAL_EXIT
    return 0


if __name__ == "__main__":
    sys.exit(main())
