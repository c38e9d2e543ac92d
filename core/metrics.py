"""walflow's Prometheus metrics: every metric defined once, here, on a registry of the process's own.

One :class:`Metrics` per process, held by :class:`core.runtime.Runtime` (nothing is
process-global: tests run several pipelines' parts in one interpreter) and served as
``/metrics`` by the health endpoint (``dataflows/health.py``). The registry is walflow's
own rather than prometheus-client's global one: every name it serves starts with
``walflow_`` (``README.md``, *Metrics*), the process's CPU, memory and file descriptors
included (``walflow_process_*``, prometheus-client's process collector under walflow's
namespace); the global registry's ``python_gc_*`` and ``python_info`` would break that rule
and say little about a process that freezes its garbage collector (``dataflows/cdc.py``).

**The hot path counts in plain ints.** A prometheus-client counter takes a lock and a
label lookup per call: per change, at tens of thousands a second, that would show in the
benchmark. Code that sees every change counts into a :class:`CounterBatch` or a
:class:`HistogramBatch` (a ``defaultdict`` increment, a list increment) and flushes it into
the shared metric once per batch: per ``next_batch``, per filtered batch, per share of the
sink's window acknowledged. Everything else (reconnects, retries, heartbeats, the slot's
figures every few seconds) updates its metric directly.

Metrics are per process: in a cluster each process counts what it did (the slot's
figures come from the process that reads the slot) and serves them on its own endpoint.
"""

from __future__ import annotations

import logging
import threading
from bisect import bisect_left
from collections import defaultdict
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Final, Generic, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import HistogramMetricFamily, Metric
from prometheus_client.process_collector import ProcessCollector

K = TypeVar("K", bound=Hashable)
log = logging.getLogger("walflow.metrics")

#: Seconds, for latencies from a millisecond (commit → ack at low rates: 4 ms at the median,
#: README "Performance") to minutes (a catch-up, an outage of NATS).
LATENCY_BUCKETS: Final = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
)
#: The values ``pg_replication_slots.wal_status`` takes (PostgreSQL 13+).
WAL_STATUSES: Final = ("reserved", "extended", "unreserved", "lost")
#: What ``walflow_backpressure_seconds_total`` is split by: the reader's buffer, the source's
#: per-epoch budget and a sink partition's window of unacknowledged messages.
BOUNDS: Final = ("reader_buffer", "epoch_budget", "sink_window")


#: The most distinct tables the ``table`` label of a metric takes in one process; the changes
#: of any further table are counted under :data:`OTHER_TABLES` (one warning says so). A role
#: that may create tables in a ``FOR ALL TABLES`` publication must not grow memory without bound.
MAX_TABLE_LABELS: Final = 10_000
OTHER_TABLES: Final = "_other"


class TableLabels:
    """The ``table`` label's values, bounded: the first :data:`MAX_TABLE_LABELS` tables by name,
    then :data:`OTHER_TABLES`. One per process (:class:`Metrics`), shared by its metrics."""

    def __init__(self, limit: int = MAX_TABLE_LABELS) -> None:
        self.limit = limit
        self._seen: set[str] = set()
        self._lock = threading.Lock()
        self._warned = False

    def __call__(self, table: str) -> str:
        if table in self._seen:
            return table
        with self._lock:
            if len(self._seen) < self.limit:
                self._seen.add(table)
                return table
            if not self._warned:
                self._warned = True
                log.warning("more than %d tables seen: the metrics count any further table as table=%r",
                            self.limit, OTHER_TABLES)
        return OTHER_TABLES


class _TableCounter(Counter):
    """A counter with a ``table`` label whose values :class:`TableLabels` bounds (``tables``,
    set by :class:`Metrics`; the children prometheus-client makes per label values have none)."""

    tables: TableLabels | None = None

    def labels(self, *labelvalues: object, **labelkwargs: object) -> _TableCounter:
        tables = self.tables
        if tables is not None and labelvalues:
            values = list(labelvalues)
            at = self._labelnames.index("table")
            values[at] = tables(str(values[at]))
            labelvalues = tuple(values)
        return super().labels(*labelvalues, **labelkwargs)


class CounterBatch(Generic[K]):
    """Counts for one labelled counter kept in plain ints, added to it by :meth:`flush`.

    The hot path does ``counts[key] += 1`` with whatever key it has at hand (a cached
    subject, a ``Table``, a ``(Table, action)`` pair): no label strings built per change. ``labels``
    turns a key into the counter's label values, once per key. One thread counts and
    flushes (the one that sees the changes); the counter itself is read at scrape time.
    """

    __slots__ = ("_children", "_counter", "_labels", "counts")

    def __init__(self, counter: Counter, labels: Callable[[K], Sequence[str]]) -> None:
        self.counts: defaultdict[K, int] = defaultdict(int)
        self._counter = counter
        self._labels = labels
        self._children: dict[K, Counter] = {}

    def flush(self) -> None:
        """Add what was counted since the last flush to the counter."""
        if not self.counts:
            return
        children = self._children
        for key, n in self.counts.items():
            child = children.get(key)
            if child is None:
                child = children[key] = self._counter.labels(*self._labels(key))
            child.inc(n)
        self.counts.clear()


class BatchedHistogram:
    """A labelled histogram fed in batches (:meth:`batch`), served by a collector of its own.

    prometheus-client's ``Histogram`` takes a lock per observation and has no way to add a
    batch's bucket counts at once; this one is merged into under one lock per batch.
    """

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str], buckets: Sequence[float],
                 registry: CollectorRegistry) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self.bounds = tuple(sorted(buckets))
        self._lock = threading.Lock()
        #: label values -> (per-bucket counts, the last one past every bound; sum of values)
        self._series: dict[tuple[str, ...], tuple[list[int], list[float]]] = {}
        registry.register(self)

    def batch(self, *labels: str) -> HistogramBatch:
        """An accumulator for the series with these label values (one per thread that observes)."""
        return HistogramBatch(self, labels)

    def add(self, labels: tuple[str, ...], counts: Sequence[int], total: float) -> None:
        """Merge one batch: ``counts`` per bucket (non-cumulative, +Inf last) and the values' sum."""
        with self._lock:
            series = self._series.get(labels)
            if series is None:
                series = self._series[labels] = ([0] * (len(self.bounds) + 1), [0.0])
            into = series[0]
            for i, n in enumerate(counts):
                into[i] += n
            series[1][0] += total

    def describe(self) -> Iterable[Metric]:
        return [HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)]

    def collect(self) -> Iterable[Metric]:
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
        with self._lock:
            series = [(labels, list(counts), total[0]) for labels, (counts, total) in self._series.items()]
        for labels, counts, total in series:
            cumulative, buckets = 0, []
            for bound, n in zip((*(repr(float(b)) for b in self.bounds), "+Inf"), counts, strict=True):
                cumulative += n
                buckets.append((bound, float(cumulative)))
            family.add_metric(list(labels), buckets, total)
        return [family]


class HistogramBatch:
    """Observations of one :class:`BatchedHistogram` series in plain ints until :meth:`flush`."""

    __slots__ = ("_bounds", "_histogram", "_labels", "counts", "total")

    def __init__(self, histogram: BatchedHistogram, labels: tuple[str, ...]) -> None:
        self._histogram = histogram
        self._labels = labels
        self._bounds = histogram.bounds
        self.counts = [0] * (len(histogram.bounds) + 1)
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self._bounds, value)] += 1  # a bucket holds values <= its bound
        self.total += value

    def flush(self) -> None:
        """Merge what was observed since the last flush into the histogram."""
        if any(self.counts):
            self._histogram.add(self._labels, self.counts, self.total)
            self.counts = [0] * len(self.counts)
            self.total = 0.0


class _Sum:
    """A gauge's value: the sum of what several parts report (a sink's partitions in this process)."""

    def __init__(self) -> None:
        self.parts: list[Callable[[], float]] = []

    def __call__(self) -> float:
        return float(sum(part() for part in list(self.parts)))


class Metrics:
    """The process's metrics; :meth:`exposition` is what ``/metrics`` serves."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        ProcessCollector(namespace="walflow", registry=r)

        # -- changes --------------------------------------------------------------------
        self.changes_received = _TableCounter(
            "walflow_changes_received_total",
            "Row changes decoded from a replication slot (truncates included), by slot, table (schema.table) and "
            "action.",
            ["slot", "table", "action"], registry=r)
        self.changes_filtered = _TableCounter(
            "walflow_changes_filtered_total",
            "Changes from the slot that a sink's filters dropped (its actions, source tables, row filters; every "
            "truncate).",
            ["sink", "table", "action"], registry=r)
        self.dead_letters = _TableCounter(
            "walflow_dead_letters_total",
            "Changes a sink could not shape, published as dead letters in their place (on_error: dead_letter), by "
            "the step that failed (filter, enrichment, transform, envelope, routing).",
            ["sink", "table", "step"], registry=r)
        self.oversized_values = Counter(
            "walflow_oversized_values_total",
            "Column values replaced by the oversized marker, by the limit they broke: max_change (a change or a "
            "read row over walflow.max_change_mb, counted once for every sink) or max_payload (a sink's message "
            "over its NATS server's max_payload). Its table label is bounded like the others' (core/sizes.py maps "
            "it, and a table counted as _other has its columns counted so too).",
            ["limit", "table", "column"], registry=r)
        #: What core/sizes.py already warned about in this process (one warning per table and column each).
        self.oversized_warned: set[tuple[str, ...]] = set()
        self.changes_published = _TableCounter(
            "walflow_changes_published_total",
            "Messages JetStream acknowledged (stored, or dropped as a duplicate of one stored), backfill reads "
            "as action read.",
            ["sink", "table", "action"], registry=r)
        self.commit_to_ack = BatchedHistogram(
            "walflow_commit_to_ack_seconds",
            "From a change's commit timestamp (the server's clock) to its JetStream acknowledgement (walflow's).",
            ["sink"], LATENCY_BUCKETS, r)

        # -- publishing -------------------------------------------------------------------
        self.publish_retries = Counter(
            "walflow_publish_retries_total",
            "Messages sent again: reason ack_timeout (no acknowledgement in time), disconnected (NATS away), "
            "jetstream_error (a retryable error acknowledgement; its code in walflow_publish_failures_total).",
            ["sink", "reason"], registry=r)
        self.publish_failures = Counter(
            "walflow_publish_failures_total",
            "Error acknowledgements from JetStream, by its error code (503: no responders, the stream has no leader "
            "during an election or no stream captures the subject); "
            "a 4xx other than 408, 409, 429 stops the pipeline.",
            ["sink", "code"], registry=r)

        self.stream_leaderless = Histogram(
            "walflow_stream_leaderless_seconds",
            "How long a sink's stream was without a leader (a JetStream cluster's election): from walflow finding "
            "its publishes unanswered (503 no responders) or the stream not answering a re-send's check to the "
            "stream answering with a leader again.",
            ["sink"], buckets=LATENCY_BUCKETS, registry=r)
        self.nats_connected = Gauge(
            "walflow_nats_connected",
            "1 for the NATS server a connection (walflow:<sink>) is connected to, 0 for one it lost.",
            ["connection", "server"], registry=r)

        # -- the slot ---------------------------------------------------------------------
        self.slot_lag = Gauge(
            "walflow_slot_lag_bytes",
            "pg_current_wal_lsn() - confirmed_flush_lsn, measured on the server every heartbeat interval.",
            ["slot"], registry=r)
        self.confirmed_lsn = Gauge(
            "walflow_confirmed_lsn", "The slot's confirmed_flush_lsn on the server, as a number.",
            ["slot"], registry=r)
        self.received_lsn = Gauge(
            "walflow_received_lsn", "The furthest WAL position the reader received from the walsender, as a number.",
            ["slot"], registry=r)
        self.slot_wal_status = Gauge(
            "walflow_slot_wal_status", "1 for the slot's current pg_replication_slots.wal_status, 0 for the others.",
            ["slot", "status"], registry=r)
        self.slot_safe_wal_size = Gauge(
            "walflow_slot_safe_wal_size_bytes",
            "WAL that may still be written before the slot is in danger of being lost (+Inf: "
            "max_slot_wal_keep_size is -1).",
            ["slot"], registry=r)
        self.heartbeat_round_trip = Histogram(
            "walflow_heartbeat_round_trip_seconds",
            "From writing a heartbeat (pg_logical_emit_message) to reading it back from the slot.",
            ["slot"], buckets=LATENCY_BUCKETS, registry=r)
        self.ignored_messages = Counter(
            "walflow_ignored_messages_total",
            "Logical messages under a prefix walflow owns that it did not act on, by reason: too_large (over the "
            "prefix's size limit), malformed (not the schema walflow writes), unauthenticated (a backfill signal "
            "without a valid signature while walflow.backfill.secret is set), refused (a backfill request the "
            "config does not allow), too_many (a sink's pending backfills at walflow.backfill.max_pending).",
            ["prefix", "reason"], registry=r)
        self.stream_regressions = Counter(
            "walflow_stream_regressions_total",
            "Times a sink's JetStream stream was found holding less than it had acknowledged (lost on a server "
            "crash or a restored store), each followed by a restart from the slot: outcome republished (all of it "
            "was within destination.confirm_delay_ms: published again) or lost (some of it may be past the slot). "
            "Counted by the process that restarted, for every regression since the operator started it.",
            ["sink", "stream", "outcome"], registry=r)
        self.reconnects = Counter(
            "walflow_reconnects_total",
            "Connections lost or refused that walflow retries. postgres: each replication session that ended in a "
            "retried error (cause slot_in_use, server_error: the server ended it with an SQLSTATE, connection: "
            "connecting failed or the connection broke or went silent); nats: each lost connection (cause eof, "
            "network, disconnected: pings unanswered or a protocol error) and each failed first connect "
            "(unreachable).",
            ["component", "cause"], registry=r)

        # -- bounds -----------------------------------------------------------------------
        self.inflight = Gauge(
            "walflow_inflight_bytes",
            "Estimated memory of changes held against a bound: reader_buffer (decoded, not yet taken by the "
            "dataflow), epoch_budget (handed to the dataflow in the current epoch).",
            ["bound"], registry=r)
        self.inflight_limit = Gauge(
            "walflow_inflight_limit_bytes", "The bound walflow_inflight_bytes is held to.", ["bound"], registry=r)
        self.sink_window = Gauge(
            "walflow_sink_window_messages",
            "Messages sent to JetStream and not yet acknowledged, over this process's partitions of the sink.",
            ["sink"], registry=r)
        self.sink_window_limit = Gauge(
            "walflow_sink_window_limit_messages",
            "The most messages that may be unacknowledged: max_in_flight per partition of the sink in this process.",
            ["sink"], registry=r)
        self.backpressure = Counter(
            "walflow_backpressure_seconds_total",
            "Time spent waiting because a bound was reached: reader_buffer (the reader not reading), epoch_budget "
            "(the source holding back until the epoch ends), sink_window (a sink partition waiting for acks).",
            ["bound"], registry=r)
        for bound in BOUNDS:  # each bound's series from the start, at 0
            self.backpressure.labels(bound)
        self._window_sums: dict[str, tuple[_Sum, _Sum]] = {}
        self._bound_sums: dict[str, tuple[_Sum, _Sum]] = {}

        # -- backfills --------------------------------------------------------------------
        self.backfill_rows = _TableCounter(
            "walflow_backfill_rows_total",
            "Rows a backfill handed to the dataflow as reads (rows changed during their chunk's window are left "
            "to the change).",
            ["sink", "table"], registry=r)
        self.backfill_chunks = _TableCounter(
            "walflow_backfill_chunks_total", "Backfill chunks whose reads were handed to the dataflow.",
            ["sink", "table"], registry=r)

        #: What bounds every ``table`` label of this process's metrics.
        self.tables = TableLabels()
        for metric in (self.changes_received, self.changes_filtered, self.dead_letters, self.changes_published,
                       self.backfill_rows, self.backfill_chunks):
            metric.tables = self.tables

    def exposition(self) -> bytes:
        """Every metric, in Prometheus's text format."""
        return generate_latest(self.registry)

    # -- what several parts update at once ----------------------------------------------------

    def track_bound(self, bound: str, size: Callable[[], float], limit: float) -> None:
        """One more holder of ``bound`` in this process (a slot's reader, a source partition):
        its in-flight bytes, read at scrape time from ``size``, and its limit; the gauges show the sums."""
        self._add_part(self._bound_sums, bound, self.inflight, self.inflight_limit, size, limit)

    def track_window(self, sink: str, size: Callable[[], float], limit: int) -> None:
        """One more partition of ``sink`` in this process: its unacknowledged messages, its window."""
        self._add_part(self._window_sums, sink, self.sink_window, self.sink_window_limit, size, limit)

    @staticmethod
    def _add_part(sums: dict[str, tuple[_Sum, _Sum]], label: str, gauge: Gauge, limit_gauge: Gauge,
                  size: Callable[[], float], limit: float) -> None:
        pair = sums.get(label)
        if pair is None:
            pair = sums[label] = (_Sum(), _Sum())
            gauge.labels(label).set_function(pair[0])
            limit_gauge.labels(label).set_function(pair[1])
        pair[0].parts.append(size)
        pair[1].parts.append(lambda: limit)

    def slot_sampled(self, slot: str, current: int, confirmed: int, wal_status: str | None,
                     safe_wal_size: int | None) -> None:
        """What the server said about the slot: its position, lag, WAL status and headroom."""
        self.slot_lag.labels(slot).set(max(0, current - confirmed))
        self.confirmed_lsn.labels(slot).set(confirmed)
        for status in WAL_STATUSES:
            self.slot_wal_status.labels(slot, status).set(1 if status == wal_status else 0)
        self.slot_safe_wal_size.labels(slot).set(float("inf") if safe_wal_size is None else safe_wal_size)
