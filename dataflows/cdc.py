"""The CDC dataflow: ``WALFLOW_CONFIG=config/walflow.yaml python -m bytewax.run dataflows.cdc``.

It only wires steps. One Postgres source with a partition per database the config's active
sinks read (``WALFLOW_DATABASE`` narrows it to one); for each active sink: dispatch (on the
slot's worker: filter, group key, the compact item for the sink partition,
``transforms/dispatch.py``) → JetStream, whose partitions convert, envelope
(``transforms/render.py``) and publish, on whichever worker owns them.
Each sink filters on its own; a disabled sink is not built at all. The flow's parts share
one :class:`core.runtime.Runtime`.

Step ids derive from sink names: with recovery (``-r``) a renamed sink starts afresh.
``flow`` is built when ``bytewax.run`` asks for it, not when the module is imported: importing
it (a tool, a test) opens no connection.
"""

from __future__ import annotations

import functools
import gc
import json
import logging
import os
import re
import sys
from pathlib import Path

import bytewax.operators as op
from bytewax.dataflow import Dataflow

from config import Config, ConfigError, config_path, load_config
from config.schema import DatabaseConfig, SinkConfig
from connectors.nats.regression import Regression
from connectors.nats.sink import JetStreamSink
from connectors.nats.state import SinkMemory
from connectors.nats.target import SinkTarget
from connectors.postgres.slot import confirmed_lsn
from connectors.postgres.source import PostgresSource, Slot
from core import compiled
from core.display import fatal_line
from core.errors import FatalError
from core.runtime import FATAL_EXIT, RESTARTED, Runtime
from dataflows.engine import apply_default_epoch, publishes_here, slots_here, this_cluster
from dataflows.health import serve as serve_health
from dataflows.initial_backfill import InitialBackfills
from dataflows.logs import configure_logging, held_until_configured
from dataflows.recovery import prepare as prepare_recovery
from dataflows.recovery import recovery_dir
from transforms.differences import differences
from transforms.dispatch import Dispatch
from transforms.render import Render
from transforms.route import replay_subjects
from transforms.schema_events import SchemaTracker, schema_parts
from transforms.shape import Shaping
from transforms.transactions import check_captured

log = logging.getLogger("walflow.sequin")
log_flow = logging.getLogger("walflow.flow")


def _step(name: str) -> str:
    return re.sub(r"\W", "_", name)


def databases_for(config: Config) -> list[DatabaseConfig]:
    """The databases this flow reads: every one an active sink reads (in config order), or
    only the one ``WALFLOW_DATABASE`` names (to run a database in a deployment of its own)."""
    wanted = os.environ.get("WALFLOW_DATABASE")
    if wanted:
        for db in config.databases:
            if db.name == wanted:
                return [db]
        raise ConfigError("WALFLOW_DATABASE", [f"no database named '{wanted}' in the config"])
    used = {s.database for s in config.sinks if s.enabled}
    read = [db for db in config.databases if db.name in used] or config.databases[:1]
    by_slot: dict[str, str] = {}
    for db in read:
        other = by_slot.setdefault(db.slot.name, db.name)
        if other != db.name:
            raise ConfigError(
                "databases",
                [(f"databases '{other}' and '{db.name}' both name their slot '{db.slot.name}', and one flow reads "
                 "both: a flow keys each slot's position by its name. Give each slot its own name, or run each "
                 "database in a flow of its own (WALFLOW_DATABASE=<name>)")],
            )
    return read


def build(config: Config, runtime: Runtime, beside: Path | None = None) -> Dataflow:
    """The flow for ``config``; its parts share ``runtime``; ``beside``: the config file's
    directory, where the config's Python callables may live. Its prepare step: each database's
    confirmed LSN is read and each sink's target prepared (connected, stream set up, the
    replay scan run) here, before any part is built."""
    slots: list[Slot] = []
    publishers: dict[str, tuple[SinkConfig, JetStreamSink]] = {}
    trackers: dict[str, SchemaTracker | None] = {}
    secret = None if config.walflow.mask_secret is None else config.walflow.mask_secret.get_secret_value()
    databases = databases_for(config)
    cluster = this_cluster()
    publishing = publishes_here(cluster, len(databases))
    if not publishing:
        log_flow.info("process %d of %d reads the slot(s) and takes no sink partitions: the other processes "
                      "convert, envelope and publish", cluster.process, cluster.processes)
    for db in databases:
        sinks = [s for s in config.sinks if s.enabled and s.database == db.name]
        if not sinks:
            raise ConfigError("sinks", [f"no active sink reads database '{db.name}': nothing to do"])
        for sink in sinks:
            for line in differences(sink, db):
                log.info(line)
        replay_from = confirmed_lsn(db)
        targets = {sink.name: SinkTarget.prepare(sink, db.name, runtime, replay_from=replay_from,
                                                 scanned=replay_subjects(sink, db.name), peers=config.sinks)
                   for sink in sinks}
        memories = {name: SinkMemory(target.connection, runtime, db.name, db.slot.name, name)
                    for name, target in targets.items()}
        for sink in sinks:  # shaping checks routed subjects against the stream found
            target = targets[sink.name]
            shaping = Shaping(sink, db, config.sinks.index(sink), beside, secret, target.stream.subjects)
            check_captured(sink, db.name, target.stream.name, target.stream.subjects)
            trackers[sink.name], events = schema_parts(sink, db.name, target.stream.name, target.stream.subjects,
                                                       memories[sink.name], replay_from)
            render = functools.partial(Render, sink, db, shaping, runtime.metrics, events)
            publishers[sink.name] = (sink, JetStreamSink(target, render, publishes=publishing))
        _repairing(runtime, memories)
        slots.append(Slot(db, tuple(sinks), InitialBackfills(db, sinks, memories, config.walflow.backfill),
                          max(target.horizon for target in targets.values()),
                          confirm_delay=max(sink.destination.confirm_delay_ms for sink in sinks) / 1000))
    flow = Dataflow("walflow")
    source = PostgresSource(slots, config.walflow.replication, runtime, backfill=config.walflow.backfill,
                            epoch_budget_mb=config.walflow.max_memory_mb,
                            here=slots_here(cluster, [db.slot.name for db in databases]))
    changes = op.input("postgres", flow, source)
    commits = any(slot.commits for slot in slots)  # every slot's changes and Commits reach every dispatch
    for name, (sink, publish) in publishers.items():
        step = _step(name)
        dispatch = Dispatch(sink, runtime.metrics, commits=commits, schema=trackers[name], crosses=not publishing)
        routed = op.flat_map_batch(f"{step}_dispatch", changes, runtime.guarded(f"sink {name}: dispatching", dispatch.route))
        op.output(f"{step}_publish", routed, publish)
    return flow


def _repairing(runtime: Runtime, memories: dict[str, SinkMemory]) -> None:
    """Started again to repair a stream (``connectors/nats/regression.py``): count every
    regression carried since the operator's start, say where this start resumes, and record
    the latest in the sink's memory for ``walflow status``."""
    records = (runtime.restarted or {}).get("records", [])
    for data in records:
        regression = Regression.from_json(data)
        if regression.sink in memories:
            runtime.metrics.stream_regressions.labels(
                regression.sink, regression.stream, "republished" if regression.repairable else "lost").inc()
    if records and (latest := Regression.from_json(records[-1])).sink in memories:
        log_flow.warning("started again after stream '%s' lost acknowledged messages: replication resumes from the "
                         "slot's confirmed position, and what the stream no longer holds is published again",
                         latest.stream)
        memories[latest.sink].record_regression(records[-1])


def tune_gc() -> None:
    """Keep the garbage collector off the hot path.

    Every change allocates a few container objects that live until JetStream acknowledges
    them, so with CPython's default thresholds (700, 10, 10) the collector runs often and its
    full passes walk every buffered change: CPU and pauses that were the latency tail (the
    README's Performance section has the figures). Changes hold no reference cycles; what
    does (asyncio, nats-py) is rare. So: move everything alive after startup out of the
    collector's reach (``gc.freeze``) and collect young objects every 20,000 allocations
    instead of 700.
    """
    gc.freeze()
    gc.set_threshold(20_000, 20, 100)


def _load() -> Dataflow:
    """The flow ``python -m bytewax.run`` runs: a fatal error stops the process with one line, exit 2."""
    carried = os.environ.pop(RESTARTED, None)  # this process was started again by the last (core/runtime.py)
    runtime = Runtime(exit_on_fatal=True, restarted=json.loads(carried) if carried else None)
    try:
        with held_until_configured():  # the config's own warnings come out in its log_format
            config = load_config(config_path())
            configure_logging(config.walflow.log_level, config.walflow.log_format)
        if (epoch := apply_default_epoch()) is not None:
            log_flow.info("epochs of %g s (bytewax.run was given no -s)", epoch.total_seconds())
        if (hot_path := compiled.implementation()) != "compiled":  # slower, never different: said once
            log_flow.info("the hot path runs as %s", hot_path)
        if config.walflow.health.enabled:
            serve_health(runtime, config.walflow.health)
        directory = recovery_dir(sys.argv[1:], os.environ)
        if directory is not None:
            prepare_recovery(directory, config.walflow.recovery_partitions)
        flow = build(config, runtime, Path(config_path()).resolve().parent)
        tune_gc()
        return flow
    except FatalError as exc:
        print(fatal_line(exc), file=sys.stderr)
        raise SystemExit(FATAL_EXIT) from None


def __getattr__(name: str) -> Dataflow:
    """``flow``, built when first asked for: ``bytewax.run`` looks it up right after importing
    this module, before it runs it; importing the module alone connects to nothing."""
    if name != "flow":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    built = globals()["flow"] = _load()
    return built
