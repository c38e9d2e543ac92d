"""``./run.sh bench [--quick] [options]``: see ``bench/__init__.py`` and ``--help``."""

from __future__ import annotations

import argparse
import sys
from dataclasses import fields
from pathlib import Path

from bench import delay, streaming
from bench.runner import FULL, QUICK, Options, run
from bench.walflow import DEPLOYMENTS, SHAPINGS

WORKLOADS = ("mixed", "bulk", "wide", "latency", "backfill", "twodb", "delay", "cluster", "streaming")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="./run.sh bench",
        description="walflow's benchmark (issue 7): starts its own PostgreSQL and NATS, writes "
        "bench/results/<date>[-quick].{json,md,png} and prints the markdown table.",
    )
    parser.add_argument("--quick", action="store_true", help="small sizes, about a minute: every part but twodb, (a) in w1,w2,p2 only "
                        "(add noflags, p3 with --deployments, twodb with --only)")
    sizes = parser.add_argument_group("sizes (default: full mode's; --quick changes those not given)")
    sizes.add_argument("--rows", type=int, help=f"(a) mixed ~100 B changes [full {FULL.rows:,}, quick {QUICK.rows:,}]")
    sizes.add_argument("--wide-rows", type=int,
                       help=f"(c) mixed ~1.6 KB changes [full {FULL.wide_rows:,}, quick {QUICK.wide_rows:,}]")
    sizes.add_argument("--bulk-rows", type=int,
                       help=f"(b) rows in the bulk insert transaction (then 10%% updated, 10%% deleted) "
                       f"[full {FULL.bulk_rows:,}, quick {QUICK.bulk_rows:,}]")
    sizes.add_argument("--backfill-rows", type=int,
                       help=f"rows of the table backfilled, once ~100 B and once ~1.6 KB rows "
                       f"[full {FULL.backfill_rows:,}, quick {QUICK.backfill_rows:,}]")
    sizes.add_argument("--two-db-rows", type=int,
                       help=f"twodb: mixed ~100 B changes in each of the two databases "
                       f"[full {FULL.two_db_rows:,}, quick {QUICK.two_db_rows:,}]")
    sizes.add_argument("--clients", type=int, help=f"concurrent writer sessions [{FULL.clients}]")
    sizes.add_argument("--pad", type=int, help=f"string_field length for ~100 B rows [{FULL.pad}]")
    sizes.add_argument("--wide-pad", type=int, help=f"string_field length for ~1.6 KB rows [{FULL.wide_pad}]")
    sizes.add_argument("--rates", help=f"offered rates for latency, comma-separated [{FULL.rates}]")
    sizes.add_argument("--latency-seconds", type=float,
                       help=f"seconds per latency phase, whole seconds (pgbench -T) "
                       f"[full {FULL.latency_seconds}, quick {QUICK.latency_seconds}]")
    sizes.add_argument("--sink-messages", type=int,
                       help=f"at most this many messages replayed per sink ceiling [{FULL.sink_messages:,}]")
    sizes.add_argument("--window", type=int, help=f"in-flight window of both sink-ceiling publishers [{FULL.window}]")
    parser.add_argument("--deployments", help=f"walflow deployments for (a), of {','.join(DEPLOYMENTS)} "
                        f"[full {FULL.deployments}, quick {QUICK.deployments}]. w1: -s 1 (as ./run.sh run); "
                        "noflags: python -m bytewax.run dataflows.cdc with no flag at all; w2: -w 2; p2, p3: "
                        "2 and 3 processes (-i/-a). Each run reports CPU per process and per thread; p2 and p3 "
                        "give the projection of one slot's rate with N publishing processes")
    parser.add_argument("--other-deployments", help=f"walflow deployments for (b) and (c) [{FULL.other_deployments}]")
    parser.add_argument("--two-db-deployment", help=f"the deployment of twodb, one flow reading two databases "
                        f"[{FULL.two_db_deployment}]")
    parser.add_argument("--shaping", choices=list(SHAPINGS),
                        help=f"(a) with its sink shaped too (issue 16) [{FULL.shaping}]: after each deployment's run "
                        "of (a), the same deployment over the same WAL with the bench table shaped; the report "
                        "gives both runs' changes/s and CPU µs/change and the difference per change. typical: "
                        "columns (exclude inserted_at, rename updated_at, hash-mask string_field, keep_last 4 of "
                        "numeric_field), a where condition every row passes (id >= 0: as many messages as "
                        "unshaped), and the subject {prefix}.{database}.{schema}.{table}.{record.id}.{action} "
                        "(one {record.COL} token, under <prefix>.<database>. which the stream captures). atomic: "
                        "transactions: atomic (issue 26; also over (b)'s large transaction); one-partition: "
                        "partition_count: 1, what atomic's one partition costs by itself. none: unshaped only")
    parser.add_argument("--only", help=f"run only these parts, of {','.join(WORKLOADS)} [full: all; quick: all but "
                        "twodb]; the results' names then end in them (<date>-latency.md), so a whole run's stay. "
                        "twodb: one flow over two databases (two databases: entries, a slot, publication and "
                        "sink each, no WALFLOW_DATABASE), changes/s and CPU per process for each database. cluster: (a)'s "
                        "workload (--rows) published by walflow w1 into an R1 stream on one server and into an R3 "
                        "stream on a 3-node NATS cluster, side by side. streaming (only when named here): pgoutput protocol 2 "
                        "with streaming 'on' beside protocol 1 on a bulk transaction, concurrent transactions and rolled-back "
                        "(sub)transactions (bench/streaming.py)")
    delay.add_arguments(parser)
    streaming.add_arguments(parser)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results",
                        help="results directory [bench/results]")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    base = QUICK if args.quick else FULL
    overrides = {f.name: getattr(args, f.name) for f in fields(Options) if getattr(args, f.name, None) is not None}
    if args.only:
        unknown = set(args.only.split(",")) - set(WORKLOADS)
        if unknown:
            print(f"bench: --only: unknown part(s) {', '.join(sorted(unknown))}", file=sys.stderr)
            return 2
    options = base.with_(**overrides)
    for value in (options.deployments + "," + options.other_deployments + "," + options.two_db_deployment).split(","):
        if value and value not in DEPLOYMENTS:
            print(f"bench: unknown deployment '{value}'; choose from {', '.join(DEPLOYMENTS)}", file=sys.stderr)
            return 2
    return run(options, args.out)


if __name__ == "__main__":
    sys.exit(main())
