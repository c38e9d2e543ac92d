"""Where a sink's messages differ from what Sequin would publish for the same file: one line each.

The contract promises Sequin's messages for a Sequin file, and a line at startup for every
difference that remains for the loaded config, so that nobody finds one in production.
Each line names the difference, why walflow differs, and the key that removes it where
there is one; the README's migration section has the same list with examples.
"""

from __future__ import annotations

from config.schema import DatabaseConfig, SinkConfig


def differences(sink: SinkConfig, database: DatabaseConfig) -> list[str]:
    """The differences from Sequin that apply to ``sink`` of ``database``, worded for its log."""
    where = f"sink {sink.name}: differs from Sequin:"
    dest = sink.destination
    lines = [
        f"{where} time and timetz values keep their microseconds and offset (Sequin drops both)",
        f"{where} intervals of 100 hours or more are exact (Sequin misreads their hours)",
        (f"{where} an update that changes the key under REPLICA IDENTITY DEFAULT lists the old key in changes "
         "(Sequin publishes {})"),
        (f"{where} names holding '.', '*', '>', '%' or whitespace are escaped in subjects (%XX); payload names stay "
         "as they are (Sequin publishes them unescaped, which NATS rejects or splits into other tokens)"),
        (f"{where} messages are published to JetStream and acknowledged before the slot moves (Sequin publishes "
         "with core NATS: without a stream capturing its subjects, messages are lost)"),
        (f"{where} a backfill's reads carry the same values as changes, the watermark's commit_lsn and ids naming "
         "the backfill and the row (Sequin's backfill reader writes some types otherwise)"),
        (f"{where} record_pks are the replica identity's columns (Sequin's: the primary key, also under REPLICA "
         "IDENTITY USING INDEX or NOTHING)"),
        (f"{where} a non-transactional sequin:transaction_annotations.set message is ignored (Sequin applies it "
         "to the next transaction it decodes)"),
    ]
    if dest.confirm_delay_ms:
        lines.append(f"{where} the slot is confirmed {dest.confirm_delay_ms / 1000:g} s after JetStream acknowledged a "
                     "change (confirm_delay_ms), so a server that loses acknowledged messages is repaired from the slot; "
                     "its lag is that much WAL more (Sequin confirms at once)")
    if dest.msg_id == "walflow":
        lines.append(
            f"{where} Nats-Msg-Id and idempotency_key are base64 '<database>/<sink>/<commit_lsn>:<commit_idx>' "
            "(unique when sinks share a stream); Sequin's base64 '<commit_lsn>:<commit_idx>' is "
            "destination.msg_id: sequin"
        )
    if sink.id is None or database.id is None:
        lines.append(
            f"{where} metadata.consumer.id / metadata.database.id are derived from the names: give the sink and "
            "the database Sequin's ids as id: to publish those (sequin config export leaves them out)"
        )
    if dest.tls:
        lines.append(
            f"{where} TLS to NATS verifies the server's certificate (Sequin does not verify it): "
            "set destination.tls_ca_file for a private CA"
        )
    return lines
