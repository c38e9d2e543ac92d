"""``walflow``: commands beside the dataflow (``README.md``, "Commands").

``walflow check [CONFIG] [--json]`` validates the config and the environment without
starting the flow (exit 0 when every check passes, 1 when any fails; :mod:`cli.check`).

``walflow status [CONFIG] [--json] [--sample SECONDS]`` tells whether the pipeline is
healthy and, if not, why (exit 0 healthy, 1 degraded, 2 down; :mod:`cli.status`).

Both only look: they create no slot, publication or stream, whether or not the pipeline runs.

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

from cli import check, status
from cli.probe import first_line
from config import config_path, load_config
from connectors.postgres.requests import BackfillRequestError, request_backfills
from connectors.postgres.signals import BackfillRequest, signing_key
from core.display import fatal_line, printable
from core.errors import FatalError
from core.runtime import FATAL_EXIT
from transforms.filter import SinkFilter

_CONFIG_HELP = "the config file (default: $WALFLOW_CONFIG, then config/walflow.yaml)"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="walflow", description="walflow: Postgres change data capture to NATS JetStream")
    commands = parser.add_subparsers(dest="command", required=True)
    backfill = commands.add_parser("backfill", help="backfill a table for a sink, while the pipeline runs")
    backfill.add_argument("config", nargs="?", help=_CONFIG_HELP)
    backfill.add_argument("--sink", required=True, help="the sink that publishes the rows")
    backfill.add_argument("--table", required=True, help="the table, as schema.table")
    backfill.add_argument("--sort-column", help="partial backfill: the column that orders the rows")
    backfill.add_argument("--start-position", help="partial backfill: rows whose sort column is at or after this")
    checking = commands.add_parser("check", help="validate the config and the environment, without starting the flow")
    reporting = commands.add_parser("status", help="is the pipeline healthy, and if not, why")
    for command in (checking, reporting):
        command.add_argument("config", nargs="?", help=_CONFIG_HELP)
        command.add_argument("--json", action="store_true", help="one JSON object instead of text")
    reporting.add_argument("--sample", type=_seconds, default=3.0, metavar="SECONDS",
                        help="seconds between the two samples of each slot that tell its trend (default 3; 0: one)")
    return parser


def _seconds(text: str) -> float:
    value = float(text)
    if not 0 <= value <= 600:
        raise argparse.ArgumentTypeError(f"{text}: expected seconds from 0 to 600")
    return value


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
    request_backfills(config.database(sink.database), [request], signing_key(config.walflow.backfill))
    return request.id


def _report(args: argparse.Namespace) -> int:
    """``check`` or ``status``. Every problem they look for is a finding; anything else is a bug
    of theirs, said in one line with the exit status of a failed check / a down pipeline."""
    try:
        if args.command == "status":
            return status.main(args.config or config_path(), as_json=args.json, sample_s=args.sample)
        return check.main(args.config or config_path(), as_json=args.json)
    except Exception as exc:  # noqa: BLE001 - one line, not a traceback, even for what nobody foresaw
        print(f"walflow: {args.command} failed unexpectedly ({type(exc).__name__}: {printable(first_line(exc))}); "
              "this is a bug in walflow", file=sys.stderr)
        return status.EXIT["down"] if args.command == "status" else 1


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.ERROR)  # the pipeline's warnings (tables without a key, …) are its own
    if args.command in ("check", "status"):
        return _report(args)
    try:
        if args.command == "backfill":
            print(backfill(args))
    except FatalError as exc:
        print(fatal_line(exc), file=sys.stderr)
        return FATAL_EXIT
    except psycopg.OperationalError as exc:
        print(f"walflow: cannot reach the database: {printable(first_line(exc))}", file=sys.stderr)
        return FATAL_EXIT
    return 0


if __name__ == "__main__":
    sys.exit(main())
