"""Running the real pipeline (``python -m bytewax.run dataflows.cdc``) from tests, and reading the stream."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nats
from nats.js.errors import NotFoundError

from embedded._process import Account, ServerProcess

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Stored:
    """One message as JetStream stored it."""

    seq: int
    subject: str
    msg_id: str
    event: dict[str, Any]


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


def stored(url: str, stream: str) -> list[Stored]:
    """Everything in ``stream`` (empty if it does not exist yet), in stream order."""

    async def read() -> list[Stored]:
        nc = await nats.connect(url, connect_timeout=5, max_reconnect_attempts=0)
        try:
            js = nc.jetstream()
            try:
                info = await js.stream_info(stream)
            except NotFoundError:
                return []
            if info.state.messages == 0:
                return []
            out = []
            for seq in range(info.state.first_seq, info.state.last_seq + 1):
                msg = await js.get_msg(stream, seq)
                out.append(
                    Stored(seq, msg.subject or "", (msg.headers or {}).get("Nats-Msg-Id", ""), json.loads(msg.data or b"{}"))
                )
            return out
        finally:
            await nc.close()

    return asyncio.run(read())
