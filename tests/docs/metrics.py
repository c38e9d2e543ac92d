"""The metrics walflow serves (``shared/CONTRACT.md`` and issue 14), for the tests of what the docs draw and name."""

#: Every metric the docs may name: name -> Prometheus type.
METRICS = {
    "walflow_changes_published_total": "counter",
    "walflow_changes_received_total": "counter",
    "walflow_changes_filtered_total": "counter",
    "walflow_dead_letters_total": "counter",
    "walflow_oversized_values_total": "counter",
    "walflow_slot_lag_bytes": "gauge",
    "walflow_confirmed_lsn": "gauge",
    "walflow_received_lsn": "gauge",
    "walflow_slot_wal_status": "gauge",
    "walflow_slot_safe_wal_size_bytes": "gauge",
    "walflow_publish_retries_total": "counter",
    "walflow_publish_failures_total": "counter",
    "walflow_inflight_bytes": "gauge",
    "walflow_inflight_limit_bytes": "gauge",
    "walflow_backpressure_seconds_total": "counter",
    "walflow_heartbeat_round_trip_seconds": "histogram",
    "walflow_commit_to_ack_seconds": "histogram",
    "walflow_reconnects_total": "counter",
    "walflow_backfill_rows_total": "counter",
    "walflow_backfill_chunks_total": "counter",
    "walflow_ignored_messages_total": "counter",
    "walflow_stream_regressions_total": "counter",
    "walflow_stream_leaderless_seconds": "histogram",
    "walflow_nats_connected": "gauge",
}
