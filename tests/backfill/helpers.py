"""Helpers for the backfill tests: sinks, the ``walflow`` command, and fast reads of a stream.

:func:`tests.pipeline.stored` fetches one message per round trip, which is too slow for
the tens of thousands of reads some backfill tests make; :func:`stored` reads the
same through an ephemeral consumer, a batch at a time, and :func:`subject_counts` counts
what each subject holds without reading a message.
"""

from __future__ import annotations

import asyncio
import base64
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import nats
import yaml
from nats.js.errors import NotFoundError

from embedded._process import ServerProcess
from tests.harness import TestNames
from tests.pipeline import ROOT, Stored

WALFLOW = ROOT / ".venv" / "bin" / "walflow"


def sink(names: TestNames, name: str = "shop-sink", **keys: Any) -> dict[str, Any]:
    """A sink entry for :func:`tests.pipeline.write_config` publishing into the test's stream."""
    return {"name": name, **keys,
            "destination": {"subject_prefix": names.subject_prefix, "stream": {"name": names.stream}}}


def set_publication_sql(config: Path, init_sql: str) -> None:
    """Give the config's database the publication statement ``init_sql`` (Sequin's ``init_sql``)."""
    data = yaml.safe_load(config.read_text())
    data["databases"][0]["publication"]["init_sql"] = init_sql
    config.write_text(yaml.safe_dump(data))


def walflow(*args: str | Path, env: dict[str, str] | None = None, module: bool = False,
            timeout: float = 30) -> subprocess.CompletedProcess[str]:
    """``.venv/bin/walflow ARGS`` (``module``: ``python -m cli.main ARGS``) as a user runs it, to its exit."""
    command = [sys.executable, "-m", "cli.main"] if module else [str(WALFLOW)]
    return subprocess.run(
        [*command, *map(str, args)], cwd=ROOT, env={**os.environ, **(env or {})}, stdin=subprocess.DEVNULL,
        capture_output=True, text=True, timeout=timeout, check=False,
    )


def walflow_together(*argvs: list[str | Path], timeout: float = 30) -> list[subprocess.CompletedProcess[str]]:
    """Several ``.venv/bin/walflow`` commands started at once; each one's outcome, in order."""
    procs = [subprocess.Popen([str(WALFLOW), *map(str, argv)], cwd=ROOT, stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for argv in argvs]
    done = []
    for proc in procs:
        out, err = proc.communicate(timeout=timeout)
        done.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    return done


def log_text(proc: ServerProcess) -> str:
    """The whole log of a pipeline started by :func:`tests.pipeline.pipeline`."""
    try:
        return proc.log_path.read_text(errors="replace")
    except OSError:
        return ""


def log_lines(proc: ServerProcess, *fragments: str) -> list[str]:
    """The log lines of ``proc`` that contain every one of ``fragments``."""
    return [line for line in log_text(proc).splitlines() if all(f in line for f in fragments)]


def decode_id(msg_id: str) -> str:
    """A ``Nats-Msg-Id`` as the text it encodes."""
    return base64.b64decode(msg_id, validate=True).decode()


def subject_counts(url: str, stream: str) -> dict[str, int]:
    """How many messages ``stream`` holds per subject (empty if the stream does not exist yet)."""

    async def count() -> dict[str, int]:
        nc = await nats.connect(url, connect_timeout=5, max_reconnect_attempts=0)
        try:
            try:
                info = await nc.jetstream().stream_info(stream, subjects_filter=">")
            except NotFoundError:
                return {}
            return dict(info.state.subjects or {})
        finally:
            await nc.close()

    return asyncio.run(count())


def stored_count(url: str, stream: str) -> int:
    """Messages in ``stream`` now (0 if it does not exist yet)."""
    return sum(subject_counts(url, stream).values())


def replay(events: list[Stored], key: str = "id") -> dict[Any, dict[str, Any]]:
    """The table a consumer that applies every event in stream order ends with, by ``key``."""
    rows: dict[Any, dict[str, Any]] = {}
    for e in events:
        record = e.event["record"]
        if e.event["action"] == "delete":
            rows.pop(record[key], None)
        else:
            rows[record[key]] = record
    return rows
