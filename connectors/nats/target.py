"""Where one sink publishes: its NATS connection, its stream, and what the replay scan found.

:meth:`SinkTarget.prepare` is the flow's explicit prepare step, called from its build
(``dataflows/cdc.py``), never at an import: it connects (waiting while NATS is unreachable),
finds or creates the stream (``stream.py``), refuses a clash of Sequin ids (``clashes.py``)
and reads the stream's tail back to the slot's confirmed LSN (``replay.py``): the ids a
replay must not publish again, and the horizon the source must not confirm up to. The
sink's partitions in this process share the target; nothing is process-global.

After that it keeps both current: a connection nats-py closed for good is opened again (the
stream and the clash check with it, not the scan). Publishes that come back "no responders"
mean the stream has no leader (a cluster's election: waited for, its length logged and in
``walflow_stream_leaderless_seconds``) or it vanished (set up again), so late re-sends read
the stream the sink publishes into.

``scanned`` is what the scan and late re-sends read: the sink's own ``<prefix>.<database>.>``,
or the whole stream when routing may publish outside it (:func:`transforms.route.replay_subjects`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager, suppress

from nats.errors import NoRespondersError, OutboundBufferLimitError
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.errors import NotFoundError, ServiceUnavailableError

from config.schema import SinkConfig
from connectors.nats.clashes import check_sequin_ids
from connectors.nats.connection import RateLimitedLog, connect, permission_error
from connectors.nats.natspy import WalflowClient
from connectors.nats.regression import Acked, AckTimes, Regression, look
from connectors.nats.replay import already_published, horizon, ids_since
from connectors.nats.stream import SinkStream, ensure_stream
from core.errors import FatalError
from core.ids import IdScheme
from core.runtime import Runtime

log = logging.getLogger("walflow.nats")

#: What a JetStream API request meets while the stream has no leader to answer it, or while the
#: connection is between servers (nats-py refuses to buffer a request then: ``pending_size`` 0).
UNANSWERED = (NatsTimeoutError, NoRespondersError, ServiceUnavailableError, OutboundBufferLimitError)

#: How long one :meth:`SinkTarget.stream_again` waits for the stream to have a leader (an election
#: takes a few seconds) before the publisher re-sends anyway and asks again.
LEADER_WAIT = 30.0


class SinkTarget:
    """One sink's connection and stream in this process, and the ids its replay must skip."""

    def __init__(self, sink: SinkConfig, database: str, runtime: Runtime, *, scanned: str,
                 peers: Sequence[SinkConfig], nc: WalflowClient, stream: SinkStream, skip: frozenset[str]) -> None:
        """What :meth:`prepare` found (use that); ``database``: the configured name of the
        database the changes come from; ``runtime``: whose loop the connection lives on."""
        self.sink = sink
        self.database = database
        self.runtime = runtime
        self.scanned = scanned
        self._peers = peers
        self.ids = IdScheme(database, sink.name, sink.destination.msg_id)
        #: Ids of changes to be replayed that the stream already holds: the publisher skips them.
        self.skip = skip
        #: The highest position among them: the source confirms nothing up to it (``replay.py``).
        self.horizon = horizon(skip, self.ids)
        self._nc = nc
        self._stream = stream
        self._lock = asyncio.Lock()  # on the runtime's loop: partitions connect from several workers
        self._leader_lock = asyncio.Lock()
        #: Since when publishes went unanswered for want of a leader (None: the stream answers).
        self._leaderless_since: float | None = None
        self._elected_at = -LEADER_WAIT  # when the stream last had a leader again after an election
        self._warn = RateLimitedLog(every=10.0)

    @classmethod
    def prepare(cls, sink: SinkConfig, database: str, runtime: Runtime, *, replay_from: int, scanned: str,
                peers: Sequence[SinkConfig] = ()) -> SinkTarget:
        """Connect, set the stream up and read its tail now, at startup, rather than at the first
        message; ``replay_from``: the slot's confirmed LSN, where the source resumes;
        ``peers``: the config's sinks, of every database, which a sink with ``msg_id: sequin``
        must not share its stream with."""
        async def prepared() -> SinkTarget:
            nc, stream = await cls._open(sink, database, runtime, peers)
            ids = IdScheme(database, sink.name, sink.destination.msg_id)
            async with _closed_on_error(nc):
                with _requests_of(nc, sink):
                    found = await already_published(nc, stream.name, scanned, ids, replay_from)
            if found:
                log.info("%s: %d change(s) to be replayed are already in the stream; not publishing them again",
                         sink.name, len(found))
            return cls(sink, database, runtime, scanned=scanned, peers=peers, nc=nc, stream=stream,
                       skip=frozenset(found))

        return runtime.run(prepared())

    @staticmethod
    async def _open(sink: SinkConfig, database: str, runtime: Runtime,
                    peers: Sequence[SinkConfig]) -> tuple[WalflowClient, SinkStream]:
        """A new connection, with the stream found (or created) and Sequin ids checked on it."""
        dest = sink.destination
        nc = await connect(dest, name=f"walflow:{sink.name}", metrics=runtime.metrics)
        async with _closed_on_error(nc):
            with _requests_of(nc, sink):
                stream = await ensure_stream(nc, dest, database, atomic=sink.transactions == "atomic")
                await check_sequin_ids(nc, sink, database, peers, stream.name)
        return nc, stream

    @property
    def stream(self) -> SinkStream:
        """The stream the sink's events land in, as last found."""
        return self._stream

    async def connection(self) -> WalflowClient:
        """The sink's connection; opened again if nats-py closed it for good."""
        async with self._lock:
            if self._nc.is_closed:
                self._nc, self._stream = await self._open(self.sink, self.database, self.runtime, self._peers)
            return self._nc

    async def stream_again(self) -> None:
        """Publishes came back "no responders" (JetStream's 503): the stream has no leader (a
        cluster's election) or it vanished. Wait a while for a leader, or set the stream up again."""
        async with self._leader_lock:  # the sink's partitions in this process ask at once: one looks
            if self._leaderless_since is None:
                self._leaderless_since = time.monotonic()
            await self._await_leader()

    async def _await_leader(self) -> None:
        """Ask the stream (``STREAM.INFO``, answered by its leader) until it answers, up to
        :data:`LEADER_WAIT` seconds; set it up again if JetStream says it does not exist."""
        name, delay, waited = self._stream.name, 0.1, False
        deadline = time.monotonic() + LEADER_WAIT
        while True:
            nc = await self.connection()
            if not nc.is_connected:  # between servers: the connection's own lines say so
                if time.monotonic() >= deadline:
                    return
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)
                continue
            try:
                info = await nc.jetstream(timeout=2.0).stream_info(name)
            except NotFoundError:
                log.warning("%s: stream '%s' no longer exists; setting it up again", self.sink.name, name)
                self._stream = await ensure_stream(nc, self.sink.destination, self.database,
                                                   atomic=self.sink.transactions == "atomic")
                self._leaderless_since = None
                return
            except UNANSWERED as exc:  # no leader to answer (or the connection dropped meanwhile)
                self._warn("leader", "%s: stream '%s' has no leader (election under way: %s); waiting for one "
                           "before re-sending", self.sink.name, name, type(exc).__name__)
            else:
                leader = info.cluster.leader if info.cluster is not None else None
                if leader or info.cluster is None:  # a single server's stream has no cluster info
                    # it answers: set it up again all the same (its subjects may have lost the sink's)
                    self._stream = await ensure_stream(nc, self.sink.destination, self.database,
                                                   atomic=self.sink.transactions == "atomic")
                    if info.cluster is None:  # one server: no election to speak of
                        self._leaderless_since = None
                    else:
                        self._elected(name, leader, waited)
                    return
                self._warn("leader", "%s: stream '%s' has no leader (election under way); waiting for one "
                           "before re-sending", self.sink.name, name)
            waited = True
            if time.monotonic() >= deadline:
                return  # the publisher re-sends, and asks again if nothing answers
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)

    def _elected(self, name: str, leader: str | None, waited: bool) -> None:
        """The stream answered again: how long it was without a leader, in the log and the metrics.

        Partitions that report their publishes of the same election later find the leader at
        once: not another election (nothing logged nor observed)."""
        since, self._leaderless_since = self._leaderless_since, None
        now = time.monotonic()
        if since is None or (not waited and now - self._elected_at < LEADER_WAIT):
            return
        self._elected_at = now
        self.runtime.metrics.stream_leaderless.labels(self.sink.name).observe(now - since)
        log.info("%s: stream '%s' has a leader again (%s) after %.1fs without one; re-sending",
                 self.sink.name, name, leader or "its server", now - since)

    async def look(self, acked: Acked, ack_times: AckTimes) -> tuple[Regression | None, str | None]:
        """Whether the stream still holds ``acked`` (``regression.py``): what a publisher asks
        after a reconnect and while it runs."""
        nc = await self.connection()
        with _requests_of(nc, self.sink):
            return await look(nc, self.sink.name, self._stream.name, acked, ack_times,
                              self.sink.destination.confirm_delay_ms / 1000)

    async def stored_since(self, seq: int) -> set[str]:
        """The ids in the stream on :attr:`scanned` from sequence ``seq`` on: what a late re-send checks.

        Waits while the stream cannot answer (no leader during an election): re-sending without
        knowing what it holds could store a message twice."""
        delay = 0.5
        while True:
            try:
                return await ids_since(await self.connection(), self._stream.name, self.scanned, seq)
            except UNANSWERED as exc:
                self._warn("read", "%s: cannot read stream '%s' yet (%s); waiting for it before re-sending",
                           self.sink.name, self._stream.name, type(exc).__name__)
            async with self._leader_lock:
                if self._leaderless_since is None:
                    self._leaderless_since = time.monotonic()
                await self._await_leader()
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)

    def close(self) -> None:
        self.runtime.run(self._nc.close())


@asynccontextmanager
async def _closed_on_error(nc: WalflowClient) -> AsyncIterator[None]:
    """``nc`` closed if the block raises: a sink that refuses to start (a clash of Sequin ids, a
    stream it may not create) holds no client that goes on reconnecting behind it. A failure to
    close is the lesser news: the block's error is raised either way."""
    try:
        yield
    except BaseException:
        with suppress(Exception):
            await nc.close()
        raise


@contextmanager
def _requests_of(nc: WalflowClient, sink: SinkConfig) -> Iterator[None]:
    """JetStream API requests of ``sink`` on ``nc``: one that failed after the server reported a
    permissions violation raises the fatal error naming what to grant (it only timed out)."""
    try:
        yield
    except FatalError:
        raise
    except Exception as exc:
        denied = permission_error(nc, sink.destination, f"a JetStream API request of sink '{sink.name}'")
        if denied is not None:
            raise denied from exc
        raise
