"""Where a sink's messages differ from what Sequin would publish for the same file: one line each.

The contract promises Sequin's messages for a Sequin file, and a line at startup for every
difference that remains for the loaded config, so that nobody finds one in production.
Each line names the difference, why walflow differs, and the key that removes it where
there is one; the README's migration section has the same list with examples.
"""

from __future__ import annotations

from config.schema import SinkConfig


def differences(sink: SinkConfig) -> list[str]:
    """The differences from Sequin that apply to ``sink``, worded for its log."""
    where = f"sink {sink.name}: differs from Sequin:"
    dest = sink.destination
    lines = [
        f"{where} time and timetz values keep their microseconds and offset (Sequin drops both)",
        f"{where} an update that changes the key under REPLICA IDENTITY DEFAULT lists only the old key in "
        "changes (Sequin also lists every other column as changed from null: Postgres did not send them)",
        f"{where} table, schema and database names that are not valid NATS subject tokens are escaped in "
        "subjects (%XX), payload names stay as they are (Sequin publishes such subjects unescaped, which NATS "
        "rejects or splits)",
        f"{where} messages are published to JetStream and acknowledged before the slot moves (Sequin publishes "
        "with core NATS: without a stream capturing its subjects, messages are lost)",
        f"{where} a backfill's reads carry the watermark's commit_lsn and their index among the chunk's rows, "
        "and ids naming the backfill and the row (Sequin's are the backfill's id and a counter)",
    ]
    if dest.msg_id == "walflow":
        lines.append(
            f"{where} Nats-Msg-Id and idempotency_key are base64 '<database>/<sink>/<commit_lsn>:<commit_idx>' "
            "(unique when sinks share a stream); Sequin's base64 '<commit_lsn>:<commit_idx>' is "
            "destination.msg_id: sequin"
        )
    if dest.tls:
        lines.append(
            f"{where} TLS to NATS verifies the server's certificate (Sequin does not verify it): "
            "set destination.tls_ca_file for a private CA"
        )
    return lines
