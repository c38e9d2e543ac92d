"""Instructions per change of the hot path's steps, counted by callgrind: what noise does not move.

This machine's speed moves by half within an hour, so a change of a few percent is lost in
any timed run, A/B pairs included. An instruction count is not: it is the same on every run
of the same code. This counts, with valgrind's callgrind, the instructions one change costs
in the steps that are walflow's own CPU and need no server:

- ``decode``: the reader's decoder, a one-row transaction (Begin, an Insert of the bench
  table's seven columns, Commit), from CopyData bytes to the staged change;
- ``dispatch``: the slot's worker's step for those changes (filter, group key, partition,
  packing), each partition's list sealed as it crosses to another process;
- ``render``: a sink partition's step (conversion, the envelope, the message) for the mixed
  workload's changes, 60 % inserts, 30 % updates, 10 % deletes, unshaped;
- ``shaped``: the same with the benchmark's ``--shaping typical`` (bench/walflow.py);
- ``read``: the same step for a backfill chunk's rows, as reads of the bench table, unshaped;
- ``publish``: the NATS loop's part of each of those messages that is walflow's own: the
  publisher takes a batch (its window, the row fence, the ``HPUB`` block handed to nats-py),
  reads each ack's ``MSG`` frame from the bytes as received (``DirectParser``), matches it
  and settles; nats-py and the socket left out, the harness's own making of the frames in
  (about 1k a message).

Each is run twice under callgrind, over the same inputs once and six times: the difference
over five passes is the steps' own cost, startup and imports left out. Not counted: libpq,
Bytewax, nats-py and asyncio's reading of the socket (they need the servers; the bench's
per-thread CPU has them)::

    python -m bench.instructions                 # this checkout, as built (compiled or not)
    python -m bench.instructions --tree /tmp/old # another checkout's walflow, the same inputs

Needs valgrind. A checkout's compiled build is used if it is current (core/compiled.py).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # imported where they run: --tree puts another checkout's walflow first
    from core.events import RawChange
    from core.message import Message

#: The bench table's columns and the Postgres types their texts are (bench/workloads.py).
_COLUMNS = (("id", 23), ("string_field", 25), ("numeric_field", 1700), ("timestamp_field", 1184),
            ("json_field", 3802), ("inserted_at", 1114), ("updated_at", 1114))
#: Changes per pass.
CHANGES = 2000
_PASSES = (1, 6)
_COLLECTED = re.compile(r"Collected\s*:\s*(\d+)")


def _texts(i: int) -> tuple[bytes, ...]:
    """Row ``i`` of the bench table as Postgres prints it (a ~100 B row, as workload (a)'s)."""
    return (str(i).encode(), b"x" * 40, b"%d.%d" % (i, i % 100), b"2026-12-04 03:55:37.123456+00",
            b'{"a": %d, "b": "hello"}' % i, b"2026-12-04 03:55:37.123456", b"2026-12-04 03:55:37.123456")


def _decode(passes: int) -> int:
    from psycopg import pq
    from psycopg.adapt import Transformer

    from connectors.postgres.decoder import Decoder, ResumePoint
    from tests import pgoutput_reference as ref
    from tests.copydata import TS, FakeCatalog, text, xlog

    class Catalog(FakeCatalog):
        """The tests' catalog, its commit times loaded as production's are (psycopg's binary
        timestamptz loader, ``connectors.postgres.types.Catalog.commit_time``), not by the
        tests' exact Python arithmetic."""

        @property
        def commit_time(self) -> Any:
            return Transformer().get_loader(1184, pq.Format.BINARY).load

    relation = ref.Relation(None, 16401, "public", "benchmark_records", "d",
                            tuple(ref.Column(int(i == 0), name, 25, -1) for i, (name, _) in enumerate(_COLUMNS)))
    messages = []
    for i in range(CHANGES):
        lsn = 1000 + i * 1000
        messages += [xlog(ref.Begin(lsn, TS, 7 + i), lsn - 100),
                     xlog(ref.Insert(None, 16401, text(*(value.decode() for value in _texts(i)))), lsn - 50),
                     xlog(ref.Commit(0, lsn, lsn + 100, TS), lsn)]
    staged = 0
    for _ in range(passes):
        decoder = Decoder(Catalog(), ResumePoint())
        decoder.feed(xlog(relation))
        for message in messages:
            decoder.feed(message)
        staged += sum(1 for item in decoder.take()[0] if type(item) is not int)  # the changes, not positions
    return staged


def _changes(reads: bool) -> list[RawChange]:
    """The workload's changes as the slot's worker has them: the mixed workload's, or (``reads``)
    a backfill chunk's rows at its high watermark (connectors/postgres/backfill.py)."""
    from bench.walflow import BENCH_TABLE
    from connectors.postgres.types import TypeSpecs, loaders_for
    from core.events import RawChange, ReadOf, Table
    from tests.transforms.samples import TS

    types = TypeSpecs(tuple(oid for _, oid in _COLUMNS), ())
    schema, name = BENCH_TABLE.split(".") if "." in BENCH_TABLE else ("public", BENCH_TABLE)
    table = Table(schema, name, tuple(column for column, _ in _COLUMNS), ("id",), ("id",), loaders_for(types), "app", 1)
    changes: list[RawChange] = []
    for i in range(CHANGES):
        kind = i % 10
        if reads:
            read = ReadOf("bench", "bf-1", f'["{i}"]')
            change = RawChange("read", table, _texts(i), None, False, 1000, i + 1, TS, 0, read)
        elif kind < 6:
            change = RawChange("insert", table, _texts(i), None, False, 1000 + i, 0, TS, 9)
        elif kind < 9:
            change = RawChange("update", table, _texts(i), None, False, 1000 + i, 0, TS, 9)
        else:
            change = RawChange("delete", table, None, (str(i).encode(), *(None,) * 6), True, 1000 + i, 0, TS, 9)
        changes.append(change)
    return changes


def _sink(shaped: bool) -> Any:
    from bench.walflow import SHAPINGS
    from tests.transforms.samples import make_sink

    shaping = SHAPINGS["typical"]
    assert shaping is not None
    extra = shaping.sink if shaped else {}
    return make_sink(destination={"type": "nats", "host": "localhost", "subject_prefix": "wf"}, **extra)


def _dispatch(passes: int) -> int:
    """The slot's worker's part: filter, group key, partition and packing, each partition's list
    sealed as it crosses to another process (a cluster's slot process publishes none itself)."""
    from transforms.dispatch import Dispatch

    changes = _changes(reads=False)
    batches = [changes[start : start + 500] for start in range(0, CHANGES, 500)]  # the slot's batches
    # what is routed, counted once (the same in every run: not in the difference callgrind's counts give)
    unsealed = Dispatch(_sink(shaped=False))
    routed = 0
    for batch in batches:
        for _, items in unsealed.route(batch):
            assert isinstance(items, list)  # not crossing: the lists themselves
            routed += sum(type(item[0]) is int for item in items)  # the changes (not a table's description)
    dispatch = Dispatch(_sink(shaped=False), crosses=True)
    for _ in range(passes):
        for batch in batches:
            dispatch.route(batch)
    return passes * routed


def _render(passes: int, shaped: bool, keep: list[Message] | None = None, reads: bool = False) -> int:
    from bench.walflow import MASK_SECRET
    from core.wire import DESCRIBE, pack
    from tests.transforms.samples import ROOM, make_render

    changes = _changes(reads)
    table = changes[0].table
    items: list[Any] = [pack(change, i) for i, change in enumerate(changes)]
    render = make_render(_sink(shaped), secret=MASK_SECRET)
    render([[(DESCRIBE, table)]], ROOM)
    messages = 0
    for _ in range(passes):
        for start in range(0, CHANGES, 500):  # batches as a sink partition gets them
            rendered = render([items[start : start + 500]], ROOM)
            messages += len(rendered)
            if keep is not None:
                keep += rendered
    return messages


class _Wire:
    """What the publisher needs of a connected nats-py client, without a socket: the block of
    commands it would write is kept, so that each command's reply subject can be answered."""

    is_connected, is_closed, max_payload = True, False, 1024 * 1024

    def __init__(self) -> None:
        self.stats = {"reconnects": 0}
        self.written: list[bytes] = []

    def new_inbox(self) -> str:
        return "_INBOX_walflow.bench"

    async def send_raw(self, commands: bytes) -> bool:
        self.written.append(commands)
        return True


def _publish(passes: int) -> int:
    import asyncio

    from connectors.nats.natspy import DirectParser
    from connectors.nats.publisher import AckPublisher

    messages: list[Message] = []
    _render(1, shaped=False, keep=messages)
    for row, message in enumerate(messages, 1):
        message.row = row  # as render names rows: each change of the workload a row of its own
    wire = _Wire()
    stored = 0

    async def run() -> None:
        nonlocal stored
        publisher = AckPublisher(wire, window=1000, ack_timeout=5.0, label="bench")  # type: ignore[arg-type]
        acks = getattr(publisher, "_acks", None) or getattr(publisher, "_on_ack")  # noqa: B009 - a tree before 2026-12-07
        direct: dict[int, Any] = {1: (None, acks)}
        parser = DirectParser(wire, direct)  # type: ignore[arg-type]
        waiting = publisher._window.waiting
        for _ in range(passes):
            for start in range(0, len(messages), 500):  # a sink partition's batch
                await publisher.publish(messages[start : start + 500])
                frames: list[bytes] = []  # JetStream's acks, in order, each on its command's reply subject, as read from the socket
                for reply in list(waiting):
                    stored += 1
                    ack = b'{"stream":"WF","seq":%d}' % stored
                    frames.append(b"MSG %s 1 %d\r\n%s\r\n" % (reply, len(ack), ack))
                await parser.parse(b"".join(frames))
                wire.written.clear()
                await publisher.settle()

    asyncio.run(run())
    return stored


def step(name: str, passes: int) -> int:
    """One run of step ``name``, ``passes`` times over the same inputs (what callgrind counts):
    how many changes it staged or messages it made."""
    if name == "decode":
        return _decode(passes)
    if name in ("render", "shaped", "read"):
        return _render(passes, shaped=name == "shaped", reads=name == "read")
    if name == "publish":
        return _publish(passes)
    if name == "dispatch":
        return _dispatch(passes)
    raise SystemExit(f"no step '{name}': decode, dispatch, render, shaped, read, publish")


def _count(tree: Path, step: str, passes: int) -> int:
    """callgrind's instruction total of one run of ``step`` in ``tree``."""
    done = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable, __file__,
         "--run", step, "--passes", str(passes), "--tree", str(tree)],
        cwd=tree, capture_output=True, text=True, check=False, env={**os.environ, "PYTHONHASHSEED": "0"})
    found = _COLLECTED.search(done.stderr)
    if done.returncode or found is None:
        raise SystemExit(f"callgrind failed on {step} in {tree} (exit {done.returncode}):\n{done.stderr[-2000:]}")
    return int(found.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.instructions", description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", type=Path, default=Path(__file__).resolve().parent.parent,
                        help="the checkout whose walflow runs [this one]")
    parser.add_argument("--steps", default="decode,dispatch,render,shaped,read,publish",
                        help="of decode, dispatch, render, shaped, read, publish [all]")
    parser.add_argument("--run", help=argparse.SUPPRESS)  # one counted run (what this starts under callgrind)
    parser.add_argument("--passes", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args()
    tree = args.tree.resolve()
    if args.run:
        sys.path.insert(0, str(tree))  # run as a file: that checkout's walflow (and its build), this harness
        step(args.run, args.passes)
        return
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed: it counts the instructions (apt install valgrind)")
    implementation = subprocess.run([sys.executable, "-c", "from core import compiled; print(compiled.implementation())"],
                                    cwd=tree, capture_output=True, text=True, check=True).stdout.strip()
    print(f"{tree}: hot path {implementation}")
    for name in args.steps.split(","):
        low, high = (_count(tree, name, passes) for passes in _PASSES)
        per = (high - low) / ((_PASSES[1] - _PASSES[0]) * CHANGES)
        unit = {"decode": "one-row transaction", "publish": "message"}.get(name, "change")
        print(f"{name:>7}: {per:,.0f} instructions per {unit}")


if __name__ == "__main__":
    main()
