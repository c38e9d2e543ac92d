"""With ``msg_id: sequin``, a sink must be the only one publishing Sequin's ids into its stream.

Sequin's ids (``base64("<commit_lsn>:<commit_idx>")``) name a change by its position only:
JetStream would drop one sink's messages as duplicates of another's — every one of two sinks
of one database, and those of two databases wherever their positions coincide.
:func:`check_sequin_ids` finds where every other enabled sink with Sequin's ids, on a server
this one shares, would publish (:func:`connectors.nats.stream.stream_for`: it only looks),
and refuses to start when that is this sink's stream.
"""

from __future__ import annotations

from collections.abc import Sequence

from nats.aio.client import Client

from config.schema import SinkConfig
from connectors.nats.stream import stream_for
from core.errors import FatalError


class SharedSequinIdsError(FatalError):
    """Two sinks with ``msg_id: sequin`` publish into one stream: JetStream would drop one's
    messages as duplicates of the other's, since Sequin's ids name a position only."""


async def check_sequin_ids(nc: Client, sink: SinkConfig, database: str, peers: Sequence[SinkConfig],
                           stream: str) -> None:
    """Raise :class:`SharedSequinIdsError` when ``sink`` (of ``database``, publishing into
    ``stream``) has Sequin's ids and one of ``peers`` (the config's sinks: this one may be among
    them) publishes Sequin's ids into the same stream."""
    if sink.destination.msg_id != "sequin":
        return
    servers = set(sink.destination.server_urls)
    for peer in peers:
        dest = peer.destination
        if (peer.name, peer.database) == (sink.name, database) or not peer.enabled:
            continue
        if dest.msg_id != "sequin" or not servers & set(dest.server_urls):
            continue
        if await stream_for(nc, dest, peer.database) != stream:
            continue
        if peer.database == database:
            who = f"sinks '{sink.name}' and '{peer.name}' of database '{database}'"
            clash = "JetStream would drop one sink's messages as duplicates of the other's"
        else:
            who = (f"sinks '{sink.name}' (database '{database}') and '{peer.name}' "
                   f"(database '{peer.database}')")
            clash = ("they do not name the database either, so JetStream would drop one database's changes "
                     "as duplicates of the other's wherever their positions coincide")
        raise SharedSequinIdsError(
            f"{who} both publish into JetStream stream '{stream}' with destination.msg_id: sequin, whose ids "
            f"name a change by its commit position only: {clash}. Set msg_id: walflow on one of them (its ids "
            "name database and sink), or have it publish into another stream"
        )
