"""A sink partition's first job: the slot worker's compact items → addressed messages to publish.

Runs in the sink partition's ``write_batch``, on the worker that owns the partition: after
Bytewax's exchange, so in a cluster converting values (:mod:`transforms.convert`), shaping
and the envelope are spread over every process (``transforms/dispatch.py`` does the serial
part). Items arrive in lists, in the order the slot's worker sent them (``core/wire.py``).

**Shaping** (planned per table version by :mod:`transforms.shape`): a table without a plan
takes the envelope's unshaped path. A planned table's changes go through, in order: the TOAST
policy (:mod:`transforms.record`); enrichment (:mod:`transforms.enrich`, one query per table
per batch); the row filters (``where``, Sequin's column filters, the Python filters); columns
(:mod:`transforms.columns`: include/exclude, rename, masks, a masked key's read id hashed);
the payload (a transform, else the sequin or debezium envelope); routing (:mod:`transforms.route`).
The filters see the row as the database has it; the payload and routing only what is published.

**Failures** in a step for one change follow the sink's ``on_error``: ``stop`` raises a
:class:`core.errors.FatalError` naming the row's position and (masked) key (its epoch never
completes, so a restart after the fix publishes it); ``dead_letter`` publishes its dead letter
under its ``Nats-Msg-Id``. Neither holds the row's values: the error is its type alone, or
walflow's own text where :class:`core.errors.ValueFree` says it holds none.

**Size** (``core/sizes.py``): a message larger than ``room`` (what its server's ``max_payload``
leaves, as the publisher counts it) is rendered again with its largest values replaced by
markers until it fits, filters not asked again; one that cannot fit becomes its dead letter,
whatever ``on_error`` says. The README's *Shaping* and *Values too large* have the reasons.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from pydantic_core import to_json

from config.schema import DatabaseConfig, SinkConfig
from core.errors import FatalError, ValueFree, WordedTypeError
from core.events import TRANSACTION_END, Change, ReadOf, Row, Table, new_tuple
from core.ids import IdScheme
from core.message import Message
from core.metrics import CounterBatch, Metrics
from core.sizes import OversizedReport, largest, replaced
from core.wire import BEGIN, COMMIT, DESCRIBE, FORGET, SCHEMA, Crossing, Item, commit_time, opened
from transforms.convert import convert_fields
from transforms.debezium import Debezium
from transforms.enrich import Enricher
from transforms.envelope import Envelope
from transforms.record import record_and_changes
from transforms.schema_events import SchemaEvents
from transforms.shape import Plan, Shaping
from transforms.transactions import BLOCK_ROOM, Markers, Note

#: A planned change waiting for its batch's enrichment: its place in the output, plan, change, table
#: version, and the item it came as (its texts, should its message not fit).
_Pending = tuple[int, Plan, Change, Table, Item]
#: The step a dead letter names when its message could not fit (never stops: see the module docstring).
SIZE_STEP: Final = "size"


class StepFailed(Exception):
    """One change could not be shaped: which step, and why (the cause is chained)."""

    def __init__(self, step: str, reason: BaseException) -> None:
        super().__init__(f"{step}: {type(reason).__name__}")
        self.step = step
        self.reason = reason
        #: What dead letters and the stop line say: the exception's type, never its text (a step
        #: sees the row's values, and a value or a callable's message may quote one), unless walflow
        #: wrote that text from names and types alone (:class:`core.errors.ValueFree`).
        self.told = str(reason) if isinstance(reason, ValueFree) else type(reason).__name__


class Render:
    """One sink partition's table versions, and its items → :class:`~core.message.Message` s."""

    def __init__(self, sink: SinkConfig, database: DatabaseConfig, shaping: Shaping,
                 metrics: Metrics | None = None, schema_events: SchemaEvents | None = None) -> None:
        """``schema_events``: a sink's with ``schema_events``, which turns the ``SCHEMA`` items into messages."""
        self._sink = sink
        self._schema_events = schema_events
        self._database = database
        self._envelope = Envelope(sink, database)
        self._debezium = Debezium(sink, database) if sink.envelope == "debezium" else None
        self._shaping = shaping
        #: ``transactions: atomic``: the output marks where each unit ends (:data:`~core.events.TRANSACTION_END`).
        self._atomic = sink.transactions == "atomic"
        #: ``transaction_markers``: BEGIN and END put in around each transaction (:mod:`transforms.transactions`).
        self._markers = Markers(sink, database) if sink.transaction_markers else None
        #: uid → the table version it names, as described on this partition, and its plan.
        self._tables: dict[int, Table] = {}
        self._plans: dict[int, Plan | None] = {}
        #: One per enrichment query of the sink: each holds its own connection (per partition).
        self._enrichers: dict[int, Enricher] = {}
        self._label = f"sink '{sink.name}'"
        metrics = metrics or Metrics()
        self._filtered: CounterBatch[tuple[str, str]] = CounterBatch(
            metrics.changes_filtered, lambda key: (sink.name, *key))
        self._dead: CounterBatch[tuple[str, str]] = CounterBatch(
            metrics.dead_letters, lambda key: (sink.name, *key))
        #: The longest id a change (not a read) of this sink can have: its names and the largest position.
        self._longest_id = len(IdScheme(database.name, sink.name, sink.destination.msg_id).encode(2**64 - 1, 2**63))
        self._sizes = OversizedReport("max_payload", metrics,
                                      f"its message for sink '{sink.name}' is larger than its NATS server's max_payload")

    def __call__(self, batches: list[Crossing], room: int) -> list[Message]:
        """The messages of ``batches`` (each a dispatch step's list for this partition), in order;
        ``room``: what a message's payload, id and own header lines may take together on the sink's
        server now (its ``max_payload`` less the header block's fixed bytes, as the sink's
        publisher counts them)."""
        out: list[Message | None] = []
        pending: list[_Pending] = []
        notes: list[Note] = []  # where each BEGIN and COMMIT fell in out, for the markers
        envelope, tables, plans, atomic, markers = self._envelope, self._tables, self._plans, self._atomic, self._markers
        if markers is not None:
            room -= BLOCK_ROOM  # a Debezium payload's transaction block is filled in after
        # a change's payload within this fits whatever its id (one check per message on the unshaped
        # path; a read's id names its row's key, of no fixed length: reads are measured whole)
        fits = room - self._longest_id
        # a transaction's changes (a backfill chunk's reads) share one commit time: made once
        last_micros, last_time = -1, commit_time(0)
        for batch in batches:
            for item in opened(batch):
                head = item[0]
                if type(head) is int:
                    table = tables.get(head)
                    if table is None:
                        raise RuntimeError(f"a change names table version {head}, which was not described to this "
                                           "partition first: the items from the slot's worker arrived out of order")
                    _, action, new, old, old_is_key, lsn, idx, micros, xid, read, annotations, row = item  # type: ignore[misc]
                    if micros != last_micros:
                        last_micros, last_time = micros, commit_time(micros)
                    change = convert_fields(action, table, new, old, old_is_key, lsn, idx, last_time, xid,
                                            None if read is None else new_tuple(ReadOf, read), annotations)
                    plan = plans[head]
                    if plan is None:
                        message = envelope(change)
                        if (len(message.payload) > fits or read is not None) and _size(message) > room:
                            message = self._fit(None, change, table, item, None, message, room)
                        message.row = row
                        out.append(message)
                    else:
                        pending.append((len(out), plan, change, table, item))
                        out.append(None)
                    if read is not None and atomic:
                        out.append(TRANSACTION_END)  # a backfill's read is a unit of its own
                elif head == DESCRIBE:
                    described: Table = item[1]  # type: ignore[assignment]
                    tables[described.uid] = described
                    plans[described.uid] = self._shaping.plan(described)
                elif head == FORGET:
                    tables.pop(item[1], None)  # type: ignore[arg-type]
                    plans.pop(item[1], None)  # type: ignore[arg-type]
                elif head == COMMIT:
                    if markers is not None:
                        notes.append((len(out), item))  # type: ignore[arg-type]
                    if atomic:
                        out.append(TRANSACTION_END)
                elif head == BEGIN:
                    notes.append((len(out), item))  # type: ignore[arg-type]
                elif head == SCHEMA and self._schema_events is not None:
                    event = self._schema_events.message(item[1])  # type: ignore[arg-type]
                    if event is not None:
                        out.append(event)
        if not pending and markers is None:
            self._dead.flush()
            return out  # type: ignore[return-value]  # no None among them
        if pending:
            self._shape(pending, out, room)
            self._filtered.flush()
        self._dead.flush()
        if markers is not None:
            return markers.place(out, notes)
        return [message for message in out if message is not None]

    # -- the shaped path -----------------------------------------------------------------------

    def _shape(self, pending: list[_Pending], out: list[Message | None], room: int) -> None:
        """Fill ``out``'s places of ``pending`` with their messages (None: filtered out)."""
        views = [record_and_changes(change, plan.toast) for _, plan, change, _, _ in pending]
        enrichments = self._enrich(pending)
        for (place, plan, change, table, item), (record, changes), enrichment in zip(pending, views, enrichments,
                                                                                     strict=True):
            out[place] = message = self._shaped(plan, change, record, changes, enrichment)
            if message is None:
                self._filtered.counts[(f"{change.schema}.{change.table}", change.action)] += 1
            elif _size(message) > room:
                out[place] = message = self._fit(plan, change, table, item, enrichment, message, room)
            if message is not None:
                message.row = item[11]  # type: ignore[misc]

    def _shaped(self, plan: Plan, change: Change, record: Row, changes: Row | None, enrichment: Any,
                filtered: bool = False) -> Message | None:
        """One planned change's message, or None when a filter drops it; its ``on_error`` when a step
        fails. ``filtered``: the row passed the filters already (its message did not fit)."""
        try:
            if isinstance(enrichment, StepFailed):
                raise enrichment
            try:
                return self._message(plan, change, record, changes, enrichment, filtered)
            except (StepFailed, FatalError):
                raise
            except Exception as exc:  # not swallowed: the policy applies, with the row's position
                raise StepFailed("shaping", exc) from exc
        except StepFailed as failed:
            return self._failed(plan, change, failed)

    def _fit(self, plan: Plan | None, change: Change, table: Table, item: Item, enrichment: Any, message: Message,
             room: int) -> Message:
        """``message``, too large for its server, rendered again from ``item``'s texts with its largest
        values replaced by markers (:mod:`core.sizes`, key columns kept) until it fits in ``room``;
        its dead letter if it cannot. Each round replaces values adding up to what is still over
        (a value's JSON may be larger than its text: another round then)."""
        _, action, new, old, old_is_key, lsn, idx, micros, xid, read, annotations, _ = item  # type: ignore[misc]
        rows: tuple[Any, Any] = (old, new)
        size, lost = _size(message), [set[int](), set[int]()]
        places: list[tuple[int, int, int]] = []
        while size > room:
            more, _ = largest(rows, table.key_positions, size - room)
            if not more:
                return self._unfit(plan, change, table, size, room)
            places += more
            for r, c, _ in more:
                lost[r].add(c)
            rows = (None if old is None else replaced(old, lost[0]), None if new is None else replaced(new, lost[1]))
            fitted = convert_fields(action, table, rows[1], rows[0], old_is_key, lsn, idx, commit_time(micros), xid,
                                    None if read is None else new_tuple(ReadOf, read), annotations)
            if plan is None:
                message = self._envelope(fitted)
            else:
                again = self._shaped(plan, fitted, *record_and_changes(fitted, plan.toast), enrichment, filtered=True)
                assert again is not None  # no filter asked again
                message = again
            size = _size(message)
        where = f"the {action} at commit LSN {_lsn(lsn)} (commit_idx {idx})"
        for _, c, length in places:
            self._sizes(table.qualified, table.columns[c], length, where)
        return message

    def _unfit(self, plan: Plan | None, change: Change, table: Table, size: int, room: int) -> Message:
        """The dead letter of a message that does not fit with every value but its key's replaced."""
        self._sizes.once((table.qualified, ""), "%s: the %s at commit LSN %s (commit_idx %d) does not fit in sink "
                         "'%s''s max_payload even with every value but its key's replaced: published as a dead "
                         "letter (walflow_dead_letters_total{step=\"size\"}); later ones of this table are not "
                         "logged", table.qualified, change.action, _lsn(change.commit_lsn), change.commit_idx,
                         self._sink.name)
        return self._failed(plan, change, StepFailed(SIZE_STEP, WordedTypeError(
            f"the message is {size} bytes of payload, id and headers with every value but its key's replaced by a "
            f"marker; its NATS server takes {room}")))

    def _enrich(self, pending: list[_Pending]) -> list[Any]:
        """Each pending change's enrichment (None without one; a :class:`StepFailed` when its
        query failed): one lookup per table version and query for the whole batch."""
        wanted: dict[tuple[int, int], tuple[Plan, Table, list[tuple[str, ...]]]] = {}
        for _, plan, change, table, _ in pending:
            if plan.enrichment is not None:
                wanted.setdefault((id(plan.enrichment), table.uid), (plan, table, []))[2].append(change.pks)
        if not wanted:
            return [None] * len(pending)
        found: dict[tuple[int, int], dict[tuple[str, ...], Any] | StepFailed] = {}
        for place, (plan, table, keys) in wanted.items():
            spec = plan.enrichment
            assert spec is not None
            enricher = self._enrichers.get(id(spec))
            if enricher is None:
                enricher = self._enrichers[id(spec)] = Enricher(spec, self._database, self._label)
            try:
                found[place] = enricher.lookup(table, keys)
            except Exception as exc:  # noqa: BLE001 (not swallowed: each of its changes follows on_error)
                found[place] = StepFailed("enrichment", exc)
        results: list[Any] = []
        for _, plan, change, table, _ in pending:
            if plan.enrichment is None:
                results.append(None)
                continue
            rows = found[(id(plan.enrichment), table.uid)]
            results.append(rows if isinstance(rows, StepFailed) else rows.get(change.pks))
        return results

    def _message(self, plan: Plan, change: Change, record: Row, changes: Row | None,
                 enrichment: Any, filtered: bool = False) -> Message | None:
        """One planned change's message, or None when a filter drops it; StepFailed when a step fails.
        ``filtered``: the filters passed it already."""
        action = change.action
        envelope = self._envelope
        clear_key = envelope.key(change)
        metadata = _Lazy(lambda: envelope.metadata(change, change.pks, clear_key, enrichment))
        rows, filters = (None, ()) if filtered else (plan.rows, plan.filters)
        if rows is not None:
            try:
                if not rows(action, record, changes, change.old):
                    return None
            except Exception as exc:  # a path into a json value too deep to look into (RowFilterError)
                raise StepFailed("where", exc) from exc
        for name, function in filters:
            try:
                keep = function(action, record, changes, metadata())
            except Exception as exc:
                raise StepFailed(f"filter {name}", exc) from exc
            if type(keep) is not bool:
                raise StepFailed(f"filter {name}", WordedTypeError(f"returned {type(keep).__name__}, not True or False"))
            if not keep:
                return None
        if plan.plain:  # the envelope's own payload: only filters, routing or both apply
            base = envelope(change)
            try:
                subject, headers = plan.router(action, change.schema, change.table, record, changes, metadata,
                                               change.pks)
            except Exception as exc:
                raise StepFailed("routing", exc) from exc
            if subject is None and not headers:
                return base
            return Message(subject or base.subject, base.payload, base.msg_id, base.labels, base.commit_ts, headers)
        key, pks = self._published_key(plan, change, clear_key)
        before = change.old if action in ("update", "delete") else None
        columns = plan.columns
        if columns is not None:  # what is published from here on: masked values, key and enrichment
            record = columns.row(record)
            changes = None if changes is None else columns.row(changes)
            before = None if before is None else columns.row(before)
            if isinstance(enrichment, dict):
                enrichment = columns.foreign(enrichment)
            metadata = _Lazy(lambda: envelope.metadata(change, pks, key, enrichment))
        try:
            if plan.transform is not None:
                payload = plan.transform(action, record, changes, metadata())
            elif self._debezium is not None:
                payload = self._debezium.payload(change, before, None if action == "delete" else record, key)
            else:
                payload = envelope.shaped(change, record, changes, pks, key, enrichment)
        except Exception as exc:
            raise StepFailed("transform" if plan.transform is not None else "envelope", exc) from exc
        try:
            subject, headers = plan.router(action, change.schema, change.table, record, changes, metadata, pks)
        except Exception as exc:
            raise StepFailed("routing", exc) from exc
        default, labels = envelope.address(change.schema, change.table, action)
        return Message(subject or default, payload, key.decode("ascii"), labels, envelope.committed(change), headers)

    def _failed(self, plan: Plan | None, change: Change, failed: StepFailed) -> Message:
        """The sink's ``on_error`` for ``change``: stop (raise), or its dead letter; always its dead
        letter for a message too large (``plan`` None: an unshaped table's)."""
        key, pks = self._published_key(plan, change, self._envelope.key(change))
        if self._sink.on_error == "stop" and failed.step != SIZE_STEP:
            raise FatalError(
                f"{self._label}: {failed.step} failed for {change.schema}.{change.table} {change.action} at commit LSN "
                f"{_lsn(change.commit_lsn)} (commit_idx {change.commit_idx}, record_pks {to_json(pks).decode()}): "
                f"{failed.told}. Nothing at or after it is confirmed: fix it (or set on_error: dead_letter) and "
                "restart; it is published then"
            ) from failed
        self._dead.counts[(f"{change.schema}.{change.table}", failed.step.split(" ")[0])] += 1
        payload = to_json({
            "error": {"step": failed.step, "message": failed.told},
            "sink": self._sink.name,
            "action": change.action,
            "metadata": {
                "database_name": self._database.name, "table_schema": change.schema,
                "table_name": change.table, "commit_lsn": change.commit_lsn, "commit_idx": change.commit_idx,
                "idempotency_key": key.decode("ascii"), "record_pks": list(pks),
            },
        })
        router = self._shaping.dead_letters if plan is None else plan.router
        _, labels = self._envelope.address(change.schema, change.table, change.action)
        return Message(router.dead_letter(change.action, change.schema, change.table), payload, key.decode("ascii"),
                       labels)

    # -- helpers ---------------------------------------------------------------------------------

    def _published_key(self, plan: Plan | None, change: Change, key: bytes) -> tuple[bytes, tuple[str, ...]]:
        """``change``'s idempotency key and ``record_pks`` as published, from its key in clear
        (:meth:`Envelope.key`): with a masked key column, the texts masked and a backfill read's
        row key (which its id names) hidden by a keyed hash."""
        columns = None if plan is None else plan.columns
        if columns is None or not columns.masks_key:
            return key, change.pks
        if change.read is not None and plan is not None and plan.id_hash is not None:
            hidden = plan.id_hash.hexdigest(change.read.row_key.encode())
            key = self._envelope.read_key(change.read.backfill, hidden)
        return key, columns.pks(change.pks)

    def close(self) -> None:
        for enricher in self._enrichers.values():
            enricher.close()

    @property
    def versions(self) -> int:
        """How many table versions this partition holds (superseded ones are forgotten, and at most
        ``transforms.dispatch.MAX_VERSIONS``)."""
        return len(self._tables)


class _Lazy:
    """A value computed on first call: a change's metadata dict, built only if a step asks."""

    __slots__ = ("_make", "_value")

    def __init__(self, make: Callable[[], dict[str, Any]]) -> None:
        self._make = make
        self._value: dict[str, Any] | None = None

    def __call__(self) -> dict[str, Any]:
        if self._value is None:
            self._value = self._make()
        return self._value


def _size(message: Message) -> int:
    """What ``message`` takes of its server's ``max_payload`` beyond the header block's fixed bytes:
    payload, id (ASCII) and its own header lines, as the publisher counts them."""
    return len(message.payload) + len(message.msg_id) + len(message.headers)


def _lsn(lsn: int) -> str:
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"
