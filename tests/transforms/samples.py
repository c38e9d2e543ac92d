"""Hand-made sinks and changes for the transform tests: no servers."""

from __future__ import annotations

import calendar
import datetime as dt
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from config.schema import DatabaseConfig, SinkConfig
from connectors.nats.publisher import payload_room
from core.events import Action, Loader, RawChange, RawValue, Table
from core.metrics import Metrics
from transforms.render import Render
from transforms.shape import Shaping

TS = dt.datetime(2026, 11, 30, 4, 0, 0, 123456, tzinfo=dt.UTC)
TS_US = calendar.timegm((2026, 11, 30, 4, 0, 0)) * 1_000_000 + 123456


def make_sink(**fields: Any) -> SinkConfig:
    """A sink as the config loader builds it; ``fields`` override the defaults."""
    base: dict[str, Any] = {"name": "app-to-nats", "database": "app", "destination": {"type": "nats", "host": "nats"}}
    return SinkConfig.model_validate({**base, **fields})


def make_database(**fields: Any) -> DatabaseConfig:
    """A database as the config loader builds it (the one :func:`make_sink` reads from);
    ``fields`` override the defaults."""
    base: dict[str, Any] = {
        "name": "app",
        "hostname": "db.internal",
        "database": "app",
        "slot": {"name": "walflow_app"},
        "publication": {"name": "walflow_app"},
    }
    return DatabaseConfig.model_validate({**base, **fields})


#: What a message may take on a server with NATS's default max_payload, 1 MiB: the room render is
#: given by default.
ROOM = payload_room(1024 * 1024)


def make_render(sink: SinkConfig | None = None, database: DatabaseConfig | None = None, *,
                metrics: Metrics | None = None, beside: Path | None = None, secret: str | None = None) -> Render:
    """A sink partition's render step for ``sink`` (:func:`make_sink`'s by default) of ``database``,
    its stream capturing ``<prefix>.>``; ``beside`` and ``secret`` as :class:`Shaping` takes them."""
    sink = sink or make_sink()
    database = database or make_database()
    shaping = Shaping(sink, database, 0, beside, secret, (f"{sink.destination.subject_prefix}.>",))
    return Render(sink, database, shaping, metrics)


def raw_change(
    action: Action = "insert",
    *,
    schema: str = "public",
    table: str = "orders",
    key: tuple[str, ...] = ("id",),
    columns: tuple[str, ...] = (),
    new: Mapping[str, RawValue] | None = None,
    old: Mapping[str, RawValue] | None = None,
    old_is_key: bool = False,
    loaders: Mapping[str, Loader] | None = None,
    lsn: int = 22150152,
    idx: int = 0,
    database: str = "app",
) -> RawChange:
    """A change as the source emits it: rows of column texts. The table's columns are
    ``columns`` plus every column the rows and the key name; a column a row does not name
    is NULL (or, in a key-only old row, absent). Columns load as text unless ``loaders`` says."""
    if new is None and action in ("insert", "update"):
        new = {"id": b"7", "status": b"paid", "amount": b"12.50"}
    names = tuple(dict.fromkeys([*columns, *key, *(new or {}), *(old or {})]))
    load = loaders or {}
    shape = Table(schema, table, names, key, key, tuple(load.get(name, bytes.decode) for name in names), database)

    def row(values: Mapping[str, RawValue] | None) -> tuple[RawValue, ...] | None:
        return None if values is None else tuple(values.get(name) for name in names)

    return RawChange(action, shape, row(new), row(old), old_is_key, lsn, idx, TS, 4711)
