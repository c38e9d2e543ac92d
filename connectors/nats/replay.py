"""After a restart: which changes are already in the stream, so they are not published twice.

A restart replays every change after the slot's confirmed LSN. Some of them may have reached
JetStream before the crash; ``Nats-Msg-Id`` drops those copies only within the stream's
duplicate window (2 minutes by default), so walflow finds them itself:
:func:`already_published` probes back from the stream's tail to one of this pipeline's
messages older than the confirmed LSN, then reads forward from there. :func:`horizon` is the
highest position found: the source confirms nothing up to it until it has passed it. Why
that is exact, across restarts too: ``docs/design.md``, *connectors/nats/replay.py*.

Which messages are this pipeline's, and at which position, only its :class:`core.ids.IdScheme`
says: nothing here reads an id's text. Every read is confined to the subjects it is given
(``connectors/nats/target.py``): the sink's own ``<prefix>.<database>.>`` — Sequin's ids name
no sink nor database, so in a stream shared with other databases the subjects tell them apart
— or ``>``, the whole stream, for a sink whose routing may publish elsewhere, where walflow's
ids tell its messages apart. JetStream takes ``>`` as a filter of every read here.
"""

from __future__ import annotations

import asyncio
import logging

from nats.aio.client import Client
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.api import ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError

from core.ids import IdScheme

log = logging.getLogger("walflow.nats")


def _lsn(ids: IdScheme, msg_id: str) -> int | None:
    """The commit LSN one of this pipeline's ids names (a change's, or a transaction marker's);
    None for anyone else's."""
    found = ids.decode(msg_id)
    return ids.marker_lsn(msg_id) if found is None else found.lsn


async def already_published(
    nc: Client, stream: str, subjects: str, ids: IdScheme, since_lsn: int
) -> set[str]:
    """Ids of this pipeline's messages in ``stream`` whose commit LSN is at or after ``since_lsn``,
    and of its backfills' reads in the same tail: a chunk read again after a crash may hold
    rows whose reads are already there (they name no position)."""
    js = nc.jetstream()
    try:
        info = await js.stream_info(stream)
    except NotFoundError:
        return set()
    first, last = info.state.first_seq, info.state.last_seq
    if info.state.messages == 0 or since_lsn == 0:
        return set()
    start = await _boundary(nc, stream, subjects, first, last, ids, since_lsn)
    return {
        msg_id for msg_id in await ids_since(nc, stream, subjects, start)
        if ((lsn := _lsn(ids, msg_id)) is not None and lsn >= since_lsn) or ids.is_read(msg_id)
    }


async def ids_since(nc: Client, stream: str, subjects: str, start: int) -> set[str]:
    """The ``Nats-Msg-Id`` of every message in ``stream`` on ``subjects`` from sequence ``start`` on."""
    js = nc.jetstream()
    try:
        last = (await js.get_last_msg(stream, subjects)).seq  # the last message on our subjects
    except NotFoundError:
        return set()
    if last is None or last < start:
        return set()
    found: set[str] = set()
    sub = await js.subscribe(
        subjects,
        stream=stream,
        ordered_consumer=True,
        config=ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=max(start, 1)),
    )
    try:
        while True:
            try:
                msg = await sub.next_msg(timeout=30)
            except NatsTimeoutError:
                # a partial set would let a replay publish twice: refuse instead
                raise RuntimeError(
                    f"could not read the tail of stream {stream} from sequence {start} within 30s"
                ) from None
            found.add((msg.headers or {}).get("Nats-Msg-Id", ""))
            if msg.metadata.sequence.stream >= last:
                return found
    finally:
        await sub.unsubscribe()


def horizon(msg_ids: set[str] | frozenset[str], ids: IdScheme) -> int:
    """The highest commit LSN among this pipeline's ``msg_ids``: the source confirms nothing up to it."""
    return max((lsn for msg_id in msg_ids if (lsn := _lsn(ids, msg_id)) is not None), default=0)


async def _boundary(
    nc: Client, stream: str, subjects: str, first: int, last: int, ids: IdScheme, since_lsn: int
) -> int:
    """A stream sequence at or before which all of this pipeline's messages are older than ``since_lsn``.

    Each probe reads the first message on ``subjects`` at or after the probed sequence."""
    js = nc.jetstream()
    step = 1
    seq = last
    while seq > first:
        try:
            msg = await js.get_msg(stream, seq, subject=subjects, next=True)
        except NotFoundError:  # none on our subjects from there on (or deleted, expired): look further back
            msg = None
        if msg is not None:
            lsn = _lsn(ids, (msg.headers or {}).get("Nats-Msg-Id", ""))
            if lsn is not None and lsn < since_lsn:
                return seq
        seq = max(first, last - step)
        step *= 2
        await asyncio.sleep(0)
    return first
