"""Running the real pipeline (``python -m bytewax.run dataflows.cdc``) from tests, and reading the stream.

Public helpers: :func:`write_config` (a walflow.yaml for a test's database and NATS),
:func:`pipeline` (the dataflow in its own process), :func:`assert_running` (a ``wait_for``
check that fails with the pipeline's log once it exited), :func:`stored` / :class:`Stored`
(what JetStream holds), :func:`loads_any_depth` and :func:`any_depth` (JSON as deep as
Postgres holds it), :func:`scrape` and :func:`by_labels` (its ``/metrics``),
:func:`run_to_exit` and :func:`fatal_line` (a pipeline that must stop by itself, and the one
line it stops with), and ``ROOT`` (the repository).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats
import psycopg
import yaml
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError
from prometheus_client.parser import text_string_to_metric_families
from psycopg.conninfo import conninfo_to_dict

from embedded import wait_for
from embedded._process import Account, ServerProcess
from tests.harness import Database, Nats, TestNames, slot_active, slot_confirmed

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Stored:
    """One message as JetStream stored it."""

    seq: int
    subject: str
    msg_id: str
    event: Any
    #: The message's headers, and its payload as stored (for tests on the raw bytes).
    headers: dict[str, str] = field(default_factory=dict)
    data: bytes = b""


def write_config(
    path: Path, db: Database, nats_srv: Nats, names: TestNames, sinks: list[dict[str, Any]],
    functions: list[dict[str, Any]] | None = None, **walflow: Any
) -> Path:
    """Write ``path/walflow.yaml`` and return its path (the pipeline's log is written next to it).

    The test's database is the one database, named ``shop``, with the test's slot and
    publication (both created if missing). Every entry of ``sinks`` reads from ``shop`` and
    publishes to ``nats_srv``, confirming the slot as soon as JetStream acknowledges
    (``confirm_delay_ms: 0``: tests wait for the slot); its own keys, and its ``destination``
    keys, are merged over those. ``functions`` go under ``functions:`` (Sequin's). ``walflow`` keys go under
    ``walflow:``, over ``log_level: info`` and the health endpoint switched off.
    """
    params = conninfo_to_dict(db.dsn)
    config: dict[str, Any] = {
        "databases": [
            {
                "name": "shop",
                "hostname": params["host"],
                "port": int(str(params["port"])),
                "database": names.database,
                "username": params["user"],
                "password": db.server.password,
                "slot": {"name": names.slot, "create_if_not_exists": True},
                "publication": {"name": names.publication, "create_if_not_exists": True},
            }
        ],
        "sinks": [
            {
                "database": "shop",
                **sink,
                "destination": {"type": "nats", **nats_srv.destination, "confirm_delay_ms": 0,
                                **sink.get("destination", {})},
            }
            for sink in sinks
        ],
        "walflow": {"log_level": "info", "health": {"enabled": False}, **walflow},
    }
    if functions:
        config["functions"] = functions
    target = path / "walflow.yaml"
    target.write_text(yaml.safe_dump(config))
    return target


@contextmanager
def pipeline(
    config: Path, *args: str, env: dict[str, str] | None = None, log_suffix: str = ""
) -> Iterator[ServerProcess]:
    """The dataflow as users start it, in its own process; stopped (SIGTERM) on exit."""
    proc = ServerProcess(
        [sys.executable, "-m", "bytewax.run", "dataflows.cdc", *args],
        log_path=config.with_name(f"{config.stem}{log_suffix}.log"),
        cwd=ROOT,
        account=Account(os.geteuid(), os.getegid(), "self"),
        env={**os.environ, "WALFLOW_CONFIG": str(config), **(env or {})},
    )
    proc.start()
    try:
        yield proc
    finally:
        proc.stop(signal.SIGTERM, timeout=15)


def run_workload(config: Path, db: Database, workload: Callable[[psycopg.Connection[Any]], object],
                 *args: str, ready: tuple[Callable[[], bool], str] | None = None) -> None:
    """Run the pipeline for ``config`` (``-s 1``, then ``args``), commit ``workload`` once its slot
    is open (or ``ready``: a condition and what it waits for), and return once the slot passed
    all of it: the slot moves only past what JetStream acknowledged, so everything is in the
    stream then."""
    condition, what = ready or ((lambda: slot_active(db)), "the pipeline to open its slot")
    with pipeline(config, "-s", "1", *args) as proc:
        wait_for(condition, timeout=60, what=what, check=lambda: assert_running(proc))
        with db.connect() as conn:
            workload(conn)
        end = db.current_lsn()
        wait_for(lambda: slot_confirmed(db) >= end, timeout=60, what="the slot to pass the workload",
                 check=lambda: assert_running(proc))


def assert_running(*procs: ServerProcess) -> None:
    """Raise ``AssertionError`` with the last 40 log lines of the first of ``procs`` that exited.

    Meant as ``wait_for(..., check=lambda: assert_running(proc))``: a pipeline that died
    fails the wait at once, with its own explanation, instead of running into the timeout.
    """
    for proc in procs:
        if not proc.running:
            raise AssertionError(f"the pipeline exited:\n{proc.log_tail(40)}")


@contextmanager
def any_depth() -> Iterator[None]:
    """The interpreter's recursion limit raised for a block, so that ``json.loads`` and ``==``
    (both recurse in C, one level a call, counted by that limit) handle JSON nested as deep as
    Postgres accepts: C's stack holds thousands of levels."""
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 20_000))
    try:
        yield
    finally:
        sys.setrecursionlimit(limit)


def loads_any_depth(data: bytes) -> Any:
    """``json.loads`` of JSON however deeply nested (:func:`any_depth`)."""
    with any_depth():
        return json.loads(data)


#: Samples of one metric, by their labels (sorted pairs).
Series = dict[tuple[tuple[str, str], ...], float]


def scrape(port: int) -> dict[str, Series]:
    """Every sample of the process's ``/metrics`` (health on ``port``), by sample name, then by labels."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        assert reply.headers["Content-Type"].startswith("text/plain; version=")  # Prometheus text format
        text = reply.read().decode()
    out: dict[str, Series] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return out


def by_labels(series: Series, *labels: str) -> dict[tuple[str, ...], float]:
    """``series`` keyed by the values of ``labels`` only."""
    return {tuple(dict(key)[label] for label in labels): value for key, value in series.items()}


def stored(url: str, stream: str) -> list[Stored]:
    """Everything in ``stream`` (empty if it does not exist yet), in stream order, a batch at a time."""

    async def read() -> list[Stored]:
        nc = await nats.connect(url, connect_timeout=5, max_reconnect_attempts=0)
        try:
            js = nc.jetstream()
            try:
                info = await js.stream_info(stream)
            except NotFoundError:
                return []
            last = info.state.last_seq
            if info.state.messages == 0:
                return []
            sub = await js.pull_subscribe(
                ">", stream=stream,
                config=ConsumerConfig(ack_policy=AckPolicy.NONE, deliver_policy=DeliverPolicy.ALL,
                                      inactive_threshold=30.0),
            )
            out: list[Stored] = []
            try:
                while not out or out[-1].seq < last:
                    for msg in await sub.fetch(batch=2000, timeout=5):
                        out.append(Stored(msg.metadata.sequence.stream, msg.subject,
                                          (msg.headers or {}).get("Nats-Msg-Id", ""), loads_any_depth(msg.data or b"{}"),
                                          dict(msg.headers or {}), msg.data or b""))
            finally:
                await sub.unsubscribe()
            return out
        finally:
            await nc.close()

    return asyncio.run(read())


def run_to_exit(config: Path, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    """The pipeline for ``config``, run to its exit (killed, and the test failed, past ``timeout``)."""
    return subprocess.run(
        [sys.executable, "-m", "bytewax.run", "dataflows.cdc"],
        cwd=ROOT,
        env={**os.environ, "WALFLOW_CONFIG": str(config)},
        stdin=subprocess.DEVNULL,
        check=False,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def fatal_line(done: subprocess.CompletedProcess[str]) -> str:
    """The one ``walflow:`` line of a fatal stop; asserts exit status 2, no traceback, no panic."""
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and "panicked" not in done.stderr, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("walflow:")]
    assert len(lines) == 1, done.stderr
    return lines[0]

