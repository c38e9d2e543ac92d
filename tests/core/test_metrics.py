"""The metrics module: batched counting, the batched histogram, and what the exposition holds."""

from __future__ import annotations

import math

from prometheus_client.parser import text_string_to_metric_families

from core.metrics import LATENCY_BUCKETS, CounterBatch, Metrics


def _samples(metrics: Metrics, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """``name``'s samples (a counter's ``_total``, a histogram's ``_bucket``/``_count``/``_sum``
    by their full name in the key), parsed from the exposition."""
    out: dict[tuple[tuple[str, str], ...], float] = {}
    for family in text_string_to_metric_families(metrics.exposition().decode()):
        for sample in family.samples:
            if sample.name == name:
                out[tuple(sorted(sample.labels.items()))] = sample.value
    return out


def test_a_counter_batch_counts_in_plain_ints_until_flushed() -> None:
    metrics = Metrics()
    named: list[str] = []

    def labels(key: tuple[str, str]) -> tuple[str, str, str]:
        named.append(key[0])
        return ("orders-sink", *key)

    batch: CounterBatch[tuple[str, str]] = CounterBatch(metrics.changes_published, labels)
    for _ in range(5):
        batch.counts["public.t1", "insert"] += 1
    batch.counts["public.t2", "delete"] += 2
    assert _samples(metrics, "walflow_changes_published_total") == {}  # nothing until the flush
    batch.flush()
    batch.flush()  # nothing counted since: adds nothing
    batch.counts["public.t1", "insert"] += 1
    batch.flush()
    assert _samples(metrics, "walflow_changes_published_total") == {
        (("action", "insert"), ("sink", "orders-sink"), ("table", "public.t1")): 6.0,
        (("action", "delete"), ("sink", "orders-sink"), ("table", "public.t2")): 2.0,
    }
    assert sorted(named) == ["public.t1", "public.t2"]  # label values made once per key


def test_the_batched_histogram_merges_batches_into_cumulative_buckets() -> None:
    metrics = Metrics()
    first, second = metrics.commit_to_ack.batch("a"), metrics.commit_to_ack.batch("a")
    for value in (0.0005, 0.001, 0.003):  # a bucket holds values up to and including its bound
        first.observe(value)
    second.observe(45.0)
    second.observe(1e6)  # past every bound: +Inf only
    assert _samples(metrics, "walflow_commit_to_ack_seconds_count") == {}
    first.flush()
    second.flush()
    first.flush()
    buckets = {dict(k)["le"]: v for k, v in _samples(metrics, "walflow_commit_to_ack_seconds_bucket").items()}
    assert list(buckets) == [*(repr(b) for b in LATENCY_BUCKETS), "+Inf"]
    assert (buckets["0.001"], buckets["0.0025"], buckets["0.005"], buckets["30.0"]) == (2, 2, 3, 3)
    assert (buckets["60.0"], buckets["600.0"], buckets["+Inf"]) == (4, 4, 5)
    assert _samples(metrics, "walflow_commit_to_ack_seconds_count") == {(("sink", "a"),): 5.0}
    (total,) = _samples(metrics, "walflow_commit_to_ack_seconds_sum").values()
    assert math.isclose(total, 0.0045 + 45.0 + 1e6)


def test_slot_figures_wal_status_is_one_hot_and_unbounded_headroom_is_infinite() -> None:
    metrics = Metrics()
    metrics.slot_sampled("wf", current=5000, confirmed=1200, wal_status="extended", safe_wal_size=None)
    assert _samples(metrics, "walflow_slot_lag_bytes") == {(("slot", "wf"),): 3800.0}
    assert _samples(metrics, "walflow_confirmed_lsn") == {(("slot", "wf"),): 1200.0}
    assert {dict(k)["status"]: v for k, v in _samples(metrics, "walflow_slot_wal_status").items()} == {
        "reserved": 0.0, "extended": 1.0, "unreserved": 0.0, "lost": 0.0}
    assert _samples(metrics, "walflow_slot_safe_wal_size_bytes") == {(("slot", "wf"),): math.inf}
    metrics.slot_sampled("wf", current=5000, confirmed=5000, wal_status="reserved", safe_wal_size=1 << 30)
    assert _samples(metrics, "walflow_slot_safe_wal_size_bytes") == {(("slot", "wf"),): float(1 << 30)}
    assert _samples(metrics, "walflow_slot_lag_bytes") == {(("slot", "wf"),): 0.0}


def test_bounds_are_read_at_scrape_time_and_windows_add_up_over_partitions() -> None:
    metrics = Metrics()
    held = [100]
    metrics.track_bound("reader_buffer", lambda: held[0], 4096)
    windows = [3, 5]
    metrics.track_window("s", lambda: windows[0], 10)
    metrics.track_window("s", lambda: windows[1], 10)
    held[0], windows[0] = 250, 4
    assert _samples(metrics, "walflow_inflight_bytes") == {(("bound", "reader_buffer"),): 250.0}
    assert _samples(metrics, "walflow_inflight_limit_bytes") == {(("bound", "reader_buffer"),): 4096.0}
    assert _samples(metrics, "walflow_sink_window_messages") == {(("sink", "s"),): 9.0}
    assert _samples(metrics, "walflow_sink_window_limit_messages") == {(("sink", "s"),): 20.0}


def test_every_name_served_is_walflows_and_each_process_has_its_own() -> None:
    one, other = Metrics(), Metrics()  # two registries side by side: no name collides
    one.reconnects.labels("postgres", "connection").inc()
    families = list(text_string_to_metric_families(one.exposition().decode()))
    names = {family.name for family in families}
    assert all(name.startswith("walflow_") for name in names), sorted(names)
    assert "walflow_process_resident_memory_bytes" in names  # the process's own figures, under walflow's prefix
    assert {dict(k)["bound"] for k in _samples(one, "walflow_backpressure_seconds_total")} == {
        "reader_buffer", "epoch_budget", "sink_window"}  # every bound's series from the start
    assert _samples(other, "walflow_reconnects_total") == {}


def test_the_table_label_is_bounded() -> None:
    """A role that may create tables in a FOR ALL TABLES publication cannot grow the metrics
    without bound: past the limit, further tables count as one."""
    metrics = Metrics()
    metrics.tables.limit = 3
    for i in range(5):
        metrics.changes_received.labels("slot", f"public.t{i}", "insert").inc()
    metrics.changes_published.labels("sink", "public.t0", "insert").inc()  # a table already seen keeps its name
    tables = {s.labels["table"] for family in text_string_to_metric_families(metrics.exposition().decode())
              for s in family.samples if s.name.startswith("walflow_changes_") and "table" in s.labels}
    assert tables == {"public.t0", "public.t1", "public.t2", "_other"}
