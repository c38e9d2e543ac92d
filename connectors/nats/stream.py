"""The JetStream stream a sink's events land in: the one that captures them, else created.

JetStream stores a subject in one stream only, so the stream is decided by the sink's
subjects (:func:`core.subjects.action_patterns`), not by a name. In order:

1. A stream that captures all of them is used as it is, whatever its name (a Sequin user's
   on ``sequin.>``, or the one an earlier run created) — unless ``destination.stream.name``
   names another explicitly: then an error naming both.
2. Streams that capture only part of them are an error: walflow could publish only some of
   its events there, and JetStream would refuse a stream of walflow's beside them.
3. ``destination.stream.name`` (``WALFLOW``) is created when ``create_if_not_exists``, on
   ``<prefix>.<database>.>`` (or ``stream.subjects``): one database's subjects, not
   ``<prefix>.>``, which would collide with an operator's stream for another database.
4. If that stream exists capturing another database's subjects only, walflow adds
   ``<prefix>.<database>.>`` to it — only if walflow created it (:data:`OWN_DESCRIPTION`)
   and the config leaves its subjects to walflow. It never edits a stream it did not create.

Processes starting together may race: every change is checked again from the top
(:data:`core.errors.JETSTREAM_API` says which API errors mean "look again"). An update
replaces a stream's subjects whole, so one that raced another can still drop a subject after
its process checked it; that process then meets "no responders" at its next publish and sets
the stream up again (``on_no_stream`` in ``connectors/nats/publisher.py``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
from dataclasses import dataclass
from typing import Any, Final

from nats.aio.client import Client
from nats.js.api import DiscardPolicy, StorageType
from nats.js.api import StreamConfig as JsStreamConfig
from nats.js.errors import APIError

from config.schema import NatsDestination
from core.errors import StreamSetupError, stream_outcome
from core.subjects import database_subjects, uncaptured

log = logging.getLogger("walflow.nats")

#: The description walflow gives the streams it creates: it edits no other stream.
OWN_DESCRIPTION: Final = "walflow's events (created by walflow, which adds the subjects of further databases to it)"
#: How often the whole lookup is repeated when other processes change the streams meanwhile,
#: and the most seconds each repetition waits more than the one before (at random, so that
#: processes updating the same stream fall out of step: an update replaces the subjects whole).
_ATTEMPTS: Final = 10
_JITTER: Final = 0.05
_API: Final = "$JS.API"
_TIMEOUT: Final = 5.0


@dataclass(frozen=True, slots=True)
class SinkStream:
    """The stream a sink's events land in."""

    name: str
    #: Seconds: JetStream drops a repeated ``Nats-Msg-Id`` within this window (the stream's own setting).
    duplicate_window: float
    #: What the stream captures, as found: a routed subject must be among them
    #: (:class:`transforms.route.Router`), or JetStream would store it nowhere, or elsewhere.
    subjects: tuple[str, ...]


async def _api(nc: Client, subject: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    """One JetStream API request; its error raised as nats-py's typed ``APIError``."""
    reply = await nc.request(f"{_API}.{subject}", json.dumps(body).encode() if body else b"", timeout=_TIMEOUT)
    data: dict[str, Any] = json.loads(reply.data)
    if "error" in data:
        APIError.from_error(data["error"])
    return data


async def _info(nc: Client, name: str) -> dict[str, Any] | None:
    """A stream's info as the server sends it (its whole config kept, for an update); None if there is none."""
    try:
        return await _api(nc, f"STREAM.INFO.{name}")
    except APIError as exc:
        if stream_outcome(exc.code, exc.err_code) == "missing":
            return None
        raise


async def _overlapping(nc: Client, subject: str) -> list[dict[str, Any]]:
    """Every stream whose subjects overlap ``subject`` (JetStream's ``STREAM.NAMES`` filter),
    whether it captures all of it or only part: nats-py's ``find_stream_name_by_subject``
    returns the first of them only, which may be a partial one."""
    names: list[str] = []
    while True:
        page = await _api(nc, "STREAM.NAMES", {"subject": subject, "offset": len(names)})
        names.extend(page.get("streams") or [])
        if not page.get("streams") or len(names) >= page.get("total", 0):
            break
    infos = [await _info(nc, name) for name in names]
    return [info for info in infos if info is not None]  # one may be deleted meanwhile


def _subjects(info: dict[str, Any]) -> list[str]:
    return list(info["config"].get("subjects") or [])


def _found(info: dict[str, Any]) -> SinkStream:
    config = info["config"]
    return SinkStream(config["name"], config["duplicate_window"] / 1e9, tuple(_subjects(info)))  # ns on the wire


async def stream_for(nc: Client, dest: NatsDestination, database: str) -> str:
    """Where a sink of ``dest`` and ``database`` publishes, without changing anything: the
    stream that captures its subjects, else the one it would create or extend."""
    prefix = dest.subject_prefix
    for info in await _overlapping(nc, database_subjects(prefix, database)):
        if not uncaptured(_subjects(info), prefix, database):
            return str(info["config"]["name"])
    return dest.stream.name


async def ensure_stream(nc: Client, dest: NatsDestination, database: str, atomic: bool = False) -> SinkStream:
    """The stream this sink's events land in: found, created or extended by the rules above;
    a :class:`StreamSetupError` saying what to change when there is none. ``atomic``: the sink
    publishes atomic batches (``transactions: atomic``): the stream allows them."""
    for attempt in range(_ATTEMPTS):
        found = await _resolve(nc, dest, database)
        if found is not None:
            if atomic:
                await _allow_atomic(nc, found.name)
            return found
        await asyncio.sleep(random.uniform(0, _JITTER * attempt))
    raise StreamSetupError(
        f"the JetStream streams kept changing while walflow looked for one capturing "
        f"'{database_subjects(dest.subject_prefix, database)}' for database '{database}' ({_ATTEMPTS} times): start "
        "walflow again once they are set up"
    )


async def _resolve(nc: Client, dest: NatsDestination, database: str) -> SinkStream | None:
    """One pass of the rules; None when it changed the streams (or raced another process):
    the caller looks again."""
    cfg, prefix = dest.stream, dest.subject_prefix
    ours = database_subjects(prefix, database)
    configured = await _info(nc, cfg.name)
    if configured is not None and not uncaptured(_subjects(configured), prefix, database):
        return _found(configured)  # the common case, and the one request a restart makes

    others = [info for info in await _overlapping(nc, ours) if info["config"]["name"] != cfg.name]
    capturing = [info for info in others if not uncaptured(_subjects(info), prefix, database)]
    if capturing:
        other = capturing[0]  # JetStream lets no second stream overlap it
        name, subjects = other["config"]["name"], _subjects(other)
        if "name" in cfg.model_fields_set:
            raise StreamSetupError(
                f"destination.stream.name is '{cfg.name}', but JetStream stream '{name}' already captures walflow's "
                f"subjects '{ours}' for database '{database}' (its subjects: {subjects}), and JetStream stores a subject "
                f"in one stream only: set destination.stream.name to '{name}' or remove it, or change subject_prefix"
            )
        log.info("using JetStream stream '%s' as it is: it captures this database's subjects %s (its subjects: %s, "
                 "duplicate window %.0f s)", name, ours, ", ".join(subjects), _found(other).duplicate_window)
        return _found(other)
    if others:
        partial = "; ".join(f"'{info['config']['name']}' captures {_subjects(info)}" for info in others)
        missing = uncaptured([s for info in others for s in _subjects(info)], prefix, database)
        raise StreamSetupError(
            f"JetStream streams capture only part of walflow's subjects '{ours}' for database '{database}' ({partial}; "
            f"nothing captures e.g. '{missing[0]}'), and JetStream stores a subject in one stream only: walflow can "
            f"neither publish all its events there nor create stream '{cfg.name}' beside them. Make one stream capture "
            f"'{ours}' (e.g. '{prefix}.>'), or change subject_prefix"
        )

    if configured is not None:
        captured = _subjects(configured)
        if configured["config"].get("description") != OWN_DESCRIPTION or cfg.subjects is not None:
            raise StreamSetupError(
                f"JetStream stream '{cfg.name}' captures {captured or 'no subjects'}, not walflow's subjects "
                f"'{ours}' for database '{database}': its events would be rejected. Add '{ours}' to the stream's "
                "subjects, or point destination.stream.name / subject_prefix at a stream that captures them."
            )
        await _add_subject(nc, configured, ours)
        log.info("added %s to JetStream stream '%s' (created by walflow, capturing %s) for database '%s'",
                 ours, cfg.name, ", ".join(captured), database)
        return None

    if not cfg.create_if_not_exists:
        raise StreamSetupError(
            f"JetStream stream '{cfg.name}' does not exist, and no stream captures walflow's subjects '{ours}' for "
            f"database '{database}'. Create one capturing '{ours}', or set create_if_not_exists: true under the "
            "sink's destination.stream."
        )
    subjects = cfg.subjects if cfg.subjects is not None else [ours]
    missing = uncaptured(subjects, prefix, database)
    if missing:
        raise StreamSetupError(
            f"destination.stream.subjects {subjects} do not capture walflow's subjects '{ours}' for database "
            f"'{database}' (e.g. '{missing[0]}'): the stream would reject its events. Add '{ours}', or leave "
            "subjects out (walflow then captures exactly that)."
        )
    try:
        await nc.jetstream().add_stream(
            JsStreamConfig(
                name=cfg.name,
                description=OWN_DESCRIPTION,
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
    except APIError as exc:
        outcome = stream_outcome(exc.code, exc.err_code)
        if outcome == "again":
            return None  # another process created a stream meanwhile: look again
        if outcome != "refused":
            raise
        raise StreamSetupError(f"JetStream refused to create stream '{cfg.name}' on {subjects}: {exc.description}") from None
    log.info("created JetStream stream '%s' for %s", cfg.name, ", ".join(subjects))
    return None


#: The first nats-server with atomic batch publish (ADR-50).
ATOMIC_SINCE: Final = (2, 12)


async def _allow_atomic(nc: Client, name: str) -> None:
    """Set ``allow_atomic`` on stream ``name`` (nats-py's stream config has no field for it),
    or say why it cannot be: the server is older than 2.12, walflow did not create the stream
    (it edits none it did not create), or the stream persists asynchronously (``persist_mode:
    async``, which JetStream refuses batches on)."""
    version = nc.connected_server_version
    if (version.major, version.minor) < ATOMIC_SINCE:
        raise StreamSetupError(
            f"transactions: atomic needs nats-server {ATOMIC_SINCE[0]}.{ATOMIC_SINCE[1]} or later (atomic batch "
            f"publish), and the server walflow connected to is {version.major}.{version.minor}.{version.patch}: upgrade it, "
            "or set transactions: none")
    info = await _info(nc, name)
    if info is None:
        raise StreamSetupError(f"JetStream stream '{name}' vanished while walflow set it up: start walflow again")
    config = info["config"]
    if config.get("allow_atomic"):
        return
    if config.get("description") != OWN_DESCRIPTION:  # walflow edits no stream it did not create
        raise StreamSetupError(
            f"transactions: atomic needs JetStream stream '{name}' to allow atomic batches, and walflow did not create "
            "it, so it leaves its settings alone: set allow_atomic: true in its configuration, or set transactions: none")
    if config.get("persist_mode") == "async":
        raise StreamSetupError(
            f"transactions: atomic needs JetStream stream '{name}' to allow atomic batches, which a stream with "
            "persist_mode: async cannot: set its persist_mode to default, or set transactions: none")
    try:
        await _api(nc, f"STREAM.UPDATE.{name}", dict(config, allow_atomic=True))
    except APIError as exc:
        raise StreamSetupError(
            f"JetStream refused to allow atomic batches on stream '{name}' (transactions: atomic): {exc.description}. "
            "Set allow_atomic: true on it yourself, or set transactions: none") from None
    log.info("JetStream stream '%s' now allows atomic batches (transactions: atomic)", name)


async def _add_subject(nc: Client, info: dict[str, Any], subject: str) -> None:
    """Add ``subject`` to a stream walflow created, every other setting sent back as the server gave it."""
    config = dict(info["config"], subjects=[*_subjects(info), subject])
    try:
        await _api(nc, f"STREAM.UPDATE.{config['name']}", config)
    except APIError as exc:
        outcome = stream_outcome(exc.code, exc.err_code)
        if outcome in ("missing", "again"):
            return  # deleted meanwhile, or changed by another process: the next pass sees it
        if outcome != "refused":
            raise
        raise StreamSetupError(
            f"JetStream refused to add '{subject}' to stream '{config['name']}': {exc.description}"
        ) from None
