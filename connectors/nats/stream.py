"""The JetStream stream the events land in: created when missing, checked when present.

A stream that exists but does not capture walflow's subjects would make every publish
fail (or, with core NATS, vanish): that is a startup error that says what to change.
walflow never edits an existing stream's configuration: operators own it.
"""

from __future__ import annotations

import logging

from nats.aio.client import Client
from nats.js.api import DiscardPolicy, StorageType
from nats.js.api import StreamConfig as JsStreamConfig
from nats.js.errors import NotFoundError

from config.schema import NatsDestination
from core.errors import FatalError

log = logging.getLogger("walflow.nats")


class StreamSetupError(FatalError):
    """The configured stream cannot hold walflow's events; the message says what to change."""


def subject_covers(pattern: str, subject: str) -> bool:
    """True if every subject matching ``subject`` (which may end in ``>``) also matches ``pattern``."""
    want = pattern.split(".")
    have = subject.split(".")
    for i, token in enumerate(want):
        if token == ">":
            return i < len(have)
        if i >= len(have) or have[i] == ">":
            return False
        if token != "*" and token != have[i]:
            return False
    return len(want) == len(have)


async def ensure_stream(nc: Client, dest: NatsDestination, database: str, escaped_database: str) -> None:
    """Create the stream if allowed and missing; fail clearly if it cannot hold our subjects."""
    js = nc.jetstream()
    cfg = dest.stream
    ours = f"{dest.subject_prefix}.{escaped_database}.>"
    try:
        info = await js.stream_info(cfg.name)
    except NotFoundError:
        if not cfg.create_if_not_exists:
            raise StreamSetupError(
                f"JetStream stream '{cfg.name}' does not exist. Create it to capture '{ours}', "
                f"or set create_if_not_exists: true under the sink's destination.stream."
            ) from None
        subjects = dest.stream_subjects
        await js.add_stream(
            JsStreamConfig(
                name=cfg.name,
                subjects=subjects,
                storage=StorageType.FILE if cfg.storage == "file" else StorageType.MEMORY,
                num_replicas=cfg.replicas,
                duplicate_window=cfg.duplicate_window_ms / 1000,
                max_age=cfg.max_age_ms / 1000,
                max_bytes=cfg.max_bytes,
                max_msgs=cfg.max_msgs,
                discard=DiscardPolicy.OLD,
            )
        )
        log.info("created JetStream stream %s for %s", cfg.name, ", ".join(subjects))
        info = await js.stream_info(cfg.name)
    captured = info.config.subjects or []
    if not any(subject_covers(pattern, ours) for pattern in captured):
        raise StreamSetupError(
            f"JetStream stream '{cfg.name}' captures {captured or 'no subjects'}, not walflow's subjects "
            f"'{ours}' for database '{database}': its events would be rejected. Add '{dest.subject_prefix}.>' to the "
            "stream's subjects, or point destination.stream.name / subject_prefix at a stream that captures them."
        )
