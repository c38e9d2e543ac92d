"""Starting walflow as users do (``python -m bytewax.run dataflows.cdc -s 1``), in several deployments.

Each run gets its own slot (made before the workload, so all runs read the same WAL), its
own stream and its own subject prefix: streams may not share subjects, and a run must not
find an earlier run's messages and take them for replays.

Two things differ from a user's start, both for measuring only: ``bench/threadnames`` is put
first on ``PYTHONPATH`` (walflow's threads get their names as OS thread names, so CPU can
be read per thread), and each process serves ``/metrics`` on a port of its own (read once,
after the run: how many changes each process published).
"""

from __future__ import annotations

import copy
import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import yaml
from prometheus_client.parser import text_string_to_metric_families

from embedded._process import Account, ServerProcess, free_port

ROOT = Path(__file__).resolve().parent.parent
DATABASE_NAME = "bench"  # the database's name in walflow's config: the second subject token
#: First on walflow's PYTHONPATH: its sitecustomize names walflow's threads for /proc.
THREAD_NAMES = Path(__file__).resolve().parent / "threadnames"


@dataclass(frozen=True)
class Deployment:
    """How walflow is started: ``key`` names it in results, ``processes`` how many there are,
    ``epochs`` whether ``-s 1`` is given (``./run.sh run`` adds it; without it Bytewax's own
    default applies, as with the bare ``python -m bytewax.run dataflows.cdc``)."""

    key: str
    label: str
    processes: int
    workers: int
    epochs: bool = True

    def argv(self) -> list[list[str]]:
        """Bytewax arguments, one list per process (epochs of 1 s, walflow's default, unless not ``epochs``)."""
        base = ["-s", "1"] if self.epochs else []
        if self.processes == 1:
            return [base + (["-w", str(self.workers)] if self.workers > 1 else [])]
        addresses = ";".join(f"127.0.0.1:{free_port()}" for _ in range(self.processes))
        return [base + ["-i", str(i), "-a", addresses] for i in range(self.processes)]


DEPLOYMENTS = {
    d.key: d
    for d in (
        Deployment("w1", "1 worker", 1, 1),
        Deployment("noflags", "no flags", 1, 1, epochs=False),
        Deployment("w2", "-w 2", 1, 2),
        Deployment("p2", "2 processes", 2, 1),
        Deployment("p3", "3 processes", 3, 1),
    )
}


@dataclass(frozen=True)
class Target:
    """Where one walflow run reads from and writes to."""

    pg_port: int
    database: str
    slot: str
    publication: str
    #: The sink destination's keys that reach NATS: ``host`` and ``port`` (or a cluster's
    #: ``servers``) and the embedded server's login (``embedded.nats.NatsServer.destination``).
    nats: dict[str, Any]
    stream: str
    subject_prefix: str
    #: The stream's replicas (3 on a cluster).
    replicas: int = 1


#: The environment variable each process's health port comes from (``${…}`` in the config).
HEALTH_PORT_VARIABLE = "WALFLOW_HEALTH_PORT"

#: The bench table, as a sink's ``tables:`` names it.
BENCH_TABLE = "public.benchmark_records"
#: The key of the hash masks of a shaped run (``walflow.mask_secret``).
MASK_SECRET = "bench-mask-secret"


@dataclass(frozen=True)
class Shaping:
    """What a shaped run adds to its sink (``config/shaping.py``): ``sink`` keys merged into
    the sink, ``mask_secret`` as ``walflow.mask_secret``; ``label`` says it in results."""

    key: str
    label: str
    sink: dict[str, Any]
    mask_secret: str | None = None


#: ``--shaping``: the sink's shaping of the bench table in a shaped run of (a).
#: typical: every step that costs per row, none that drops one or needs the database: columns
#: (one excluded, one renamed, the one string column hash-masked, keep_last on another),
#: one ``where`` condition every row passes (so as many messages are published as unshaped:
#: like against like), and a subject with one ``{record.COL}`` token, under
#: ``<prefix>.<database>.``, which the sink's stream captures. The token is the key
#: (``id``): the only column a delete's old row has under the table's default replica
#: identity (a null in a subject is a failure), so each row has a subject of its own.
SHAPINGS: dict[str, Shaping | None] = {
    "none": None,
    "typical": Shaping(
        "typical",
        "columns (exclude inserted_at, rename updated_at, hash string_field, keep_last 4 of numeric_field), "
        "where id >= 0 (every row), subject {prefix}.{database}.{schema}.{table}.{record.id}.{action}",
        {
            "tables": [{
                "name": BENCH_TABLE,
                "columns": {
                    "exclude": ["inserted_at"],
                    "rename": {"updated_at": "modified_at"},
                    "mask": {"string_field": "hash", "numeric_field": {"keep_last": 4}},
                },
                "where": [{"column": "id", "gte": 0}],
            }],
            "routing": {"subject": "{prefix}.{database}.{schema}.{table}.{record.id}.{action}"},
        },
        mask_secret=MASK_SECRET,
    ),
    # not shaping: other sink keys over the same WAL, compared the same way (issue 26)
    "atomic": Shaping("atomic", "transactions: atomic (whole transactions as JetStream atomic batches, one partition)",
                      {"transactions": "atomic"}),
    "one-partition": Shaping("one-partition", "partition_count: 1 (one message at a time per change, one "
                             "partition: what atomic's single partition costs by itself)", {"partition_count": 1}),
}


def write_config(
    path: Path, target: Target | Sequence[Target], *, initial_backfill: bool = False,
    names: Sequence[str] = (DATABASE_NAME,), shaping: Shaping | None = None,
) -> Path:
    """A walflow config in Sequin's format (``config/walflow.yaml``'s shape): for each
    target a database (named by ``names``, in order) and a sink of its own, ``bench`` for a
    single target, else the database's name. The slots and publications exist already; logs
    are quiet; each process serves /metrics on the port ``WALFLOW_HEALTH_PORT`` gives it.
    ``initial_backfill``: the sinks ask, when they start, for every table they read to be
    backfilled (``walflow.backfill``'s settings as shipped). ``shaping``: its keys added to
    every sink (:data:`SHAPINGS`); None: no shaping, the envelope's unshaped path."""
    targets = [target] if isinstance(target, Target) else list(target)
    if len(names) != len(targets):
        raise ValueError(f"{len(targets)} target(s), {len(names)} database name(s)")
    config: dict[str, Any] = {
        "databases": [
            {
                "name": name,
                "hostname": "127.0.0.1",
                "port": t.pg_port,
                "database": t.database,
                "username": "postgres",
                "slot": {"name": t.slot, "create_if_not_exists": False},
                "publication": {"name": t.publication, "create_if_not_exists": False},
            }
            for name, t in zip(names, targets, strict=True)
        ],
        "sinks": [
            {
                "name": "bench" if len(targets) == 1 else name,
                "database": name,
                "initial_backfill": initial_backfill,
                "destination": {
                    "type": "nats",
                    **t.nats,
                    "subject_prefix": t.subject_prefix,
                    "confirm_delay_ms": 0,
                    "stream": {"name": t.stream, "create_if_not_exists": True, "replicas": t.replicas},
                },
                **(copy.deepcopy(shaping.sink) if shaping is not None else {}),
            }
            for name, t in zip(names, targets, strict=True)
        ],
        "walflow": {"log_level": "warning",
                    "health": {"enabled": True, "port": f"${{{HEALTH_PORT_VARIABLE}}}"}},
    }
    if shaping is not None and shaping.mask_secret is not None:
        config["walflow"]["mask_secret"] = shaping.mask_secret
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def scrape(port: int) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """One process's /metrics: sample name → {sorted labels: value}."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return out


def counts(metrics: dict[str, dict[tuple[tuple[str, str], ...], float]], name: str, label: str) -> dict[str, int]:
    """A counter's samples summed by one label's value (``walflow_changes_published_total`` by sink)."""
    out: dict[str, int] = {}
    for labels, value in metrics.get(name, {}).items():
        key = dict(labels).get(label, "")
        out[key] = out.get(key, 0) + int(value)
    return out


class Walflow:
    """walflow's processes for one deployment; stopped with SIGTERM (SIGKILL if stuck) on exit."""

    def __init__(self, config: Path, deployment: Deployment) -> None:
        self.config = config
        self.deployment = deployment
        self.procs: list[ServerProcess] = []
        self.health_ports: list[int] = []
        self._stack = ExitStack()

    def __enter__(self) -> Self:
        path = os.pathsep.join(p for p in (str(THREAD_NAMES), os.environ.get("PYTHONPATH")) if p)
        for i, args in enumerate(self.deployment.argv()):
            self.health_ports.append(free_port())
            env = {**os.environ, "WALFLOW_CONFIG": str(self.config), "PYTHONPATH": path,
                   HEALTH_PORT_VARIABLE: str(self.health_ports[-1])}
            env.pop("WALFLOW_DATABASE", None)  # every database of the config, as the config says
            for name in [k for k in env if k.startswith("BYTEWAX_")]:
                del env[name]  # the deployment's arguments alone say how Bytewax runs
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
            if (profiler := os.environ.get("BENCH_PYSPY")) and proc.pid is not None:  # a profile per process
                out = Path(os.environ.get("BENCH_PYSPY_DIR", str(self.config.parent))) / f"{self.config.stem}.{i}.txt"
                # --native: the compiled hot path's C frames too (py-spy then pauses the process per sample)
                native = ["--native"] if os.environ.get("BENCH_PYSPY_NATIVE") == "1" else ["--nonblocking"]
                subprocess.Popen([profiler, "record", "--pid", str(proc.pid), "--threads", "--gil",
                                  *native, "-r", "250", "-f", "raw", "-o", str(out)], stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stack.close()

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs if p.pid is not None]

    def metrics(self) -> list[dict[str, Any] | None]:
        """Each process's /metrics (None where it does not answer: a port taken, say)."""
        out: list[dict[str, Any] | None] = []
        for port in self.health_ports:
            try:
                out.append(scrape(port))
            except OSError:
                out.append(None)
        return out

    def check(self) -> None:
        """Raise with the log's tail if any process has exited: a run must not wait out its deadline."""
        for proc in self.procs:
            if not proc.running:
                raise RuntimeError(f"walflow exited early:\n{proc.log_tail(30)}")
