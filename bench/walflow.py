"""Starting walflow as users do (``python -m bytewax.run dataflows.cdc -s 1``), in three deployments.

Each run gets its own slot (made before the workload, so all runs read the same WAL), its
own stream and its own subject prefix: streams may not share subjects, and a run must not
find an earlier run's messages and take them for replays.
"""

from __future__ import annotations

import os
import signal
import sys
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Self

import yaml

from embedded._process import Account, ServerProcess, free_port

ROOT = Path(__file__).resolve().parent.parent
DATABASE_NAME = "bench"  # the database's name in walflow's config: the second subject token


@dataclass(frozen=True)
class Deployment:
    """How walflow is started: ``key`` names it in results, ``processes`` how many there are."""

    key: str
    label: str
    processes: int
    workers: int

    def argv(self) -> list[list[str]]:
        """Bytewax arguments, one list per process (epochs of 1 s, walflow's default)."""
        base = ["-s", "1"]
        if self.processes == 1:
            return [base + (["-w", str(self.workers)] if self.workers > 1 else [])]
        addresses = ";".join(f"127.0.0.1:{free_port()}" for _ in range(self.processes))
        return [base + ["-i", str(i), "-a", addresses] for i in range(self.processes)]


DEPLOYMENTS = {
    d.key: d
    for d in (
        Deployment("w1", "1 worker", 1, 1),
        Deployment("w2", "-w 2", 1, 2),
        Deployment("p2", "2 processes", 2, 1),
    )
}


@dataclass(frozen=True)
class Target:
    """Where one walflow run reads from and writes to."""

    pg_port: int
    database: str
    slot: str
    publication: str
    nats_host: str
    nats_port: int
    stream: str
    subject_prefix: str


def write_config(path: Path, target: Target, *, initial_backfill: bool = False) -> Path:
    """A walflow config in Sequin's format (``config/walflow.yaml``'s shape) for ``target``.
    The slot and publication exist already; logs are quiet and the health server off, so
    runs do not compete for its port. ``initial_backfill``: the sink asks, when it starts,
    for every table it reads to be backfilled (``walflow.backfill``'s settings as shipped)."""
    config = {
        "databases": [
            {
                "name": DATABASE_NAME,
                "hostname": "127.0.0.1",
                "port": target.pg_port,
                "database": target.database,
                "username": "postgres",
                "slot": {"name": target.slot, "create_if_not_exists": False},
                "publication": {"name": target.publication, "create_if_not_exists": False},
            }
        ],
        "sinks": [
            {
                "name": "bench",
                "database": DATABASE_NAME,
                "initial_backfill": initial_backfill,
                "destination": {
                    "type": "nats",
                    "host": target.nats_host,
                    "port": target.nats_port,
                    "subject_prefix": target.subject_prefix,
                    "stream": {"name": target.stream, "create_if_not_exists": True},
                },
            }
        ],
        "walflow": {"log_level": "warning", "health": {"enabled": False}},
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


class Walflow:
    """walflow's processes for one deployment; stopped with SIGTERM (SIGKILL if stuck) on exit."""

    def __init__(self, config: Path, deployment: Deployment) -> None:
        self.config = config
        self.deployment = deployment
        self.procs: list[ServerProcess] = []
        self._stack = ExitStack()

    def __enter__(self) -> Self:
        env = {**os.environ, "WALFLOW_CONFIG": str(self.config)}
        for i, args in enumerate(self.deployment.argv()):
            proc = ServerProcess(
                [sys.executable, "-m", "bytewax.run", "dataflows.cdc", *args],
                log_path=self.config.with_suffix(f".{i}.log"),
                cwd=ROOT,
                account=Account(os.geteuid(), os.getegid(), "self"),
                env=env,
            )
            proc.start()
            self.procs.append(proc)
            self._stack.callback(proc.stop, signal.SIGTERM, 15)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stack.close()

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs if p.pid is not None]

    def check(self) -> None:
        """Raise with the log's tail if any process has exited: a run must not wait out its deadline."""
        for proc in self.procs:
            if not proc.running:
                raise RuntimeError(f"walflow exited early:\n{proc.log_tail(30)}")
