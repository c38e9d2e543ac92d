"""Samplers that run beside a consumer: its memory and CPU from ``/proc``, and its slot's lag.

psutil is not a dependency, and ``/proc`` is all this needs: ``VmRSS`` for resident memory
and ``utime``/``stime`` for CPU. A walflow run is one process or several (a cluster), each
possibly with children, so every figure is summed over each process tree. Per thread,
``/proc/<pid>/task/<tid>/stat`` and ``comm`` (:func:`thread_cpu`): the names are Bytewax's
own (``timely:work-0``) and, under the benchmark, walflow's (``bench/threadnames``).
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import psycopg

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def process_tree(pid: int) -> list[int]:
    """``pid`` and its descendants (children are listed per thread in ``/proc/<pid>/task``)."""
    found = [pid]
    i = 0
    while i < len(found):
        try:
            tasks = list(Path(f"/proc/{found[i]}/task").glob("*/children"))
        except OSError:  # it ended between being listed and being read
            tasks = []
        for task in tasks:
            try:
                found.extend(int(child) for child in task.read_text().split())
            except OSError:
                continue
        i += 1
    return found


def rss_bytes(pid: int) -> int:
    """Resident memory of ``pid``'s process tree (0 for processes that are gone)."""
    total = 0
    for member in process_tree(pid):
        try:
            status = Path(f"/proc/{member}/status").read_text()
        except OSError:
            continue
        for line in status.splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1]) * 1024
                break
    return total


def _stat_ticks(stat: str, last: int) -> int:
    """utime + stime (+ cutime + cstime when ``last`` is 15) of one ``stat`` line, in clock ticks."""
    # the command name (field 2) may hold spaces: count fields after its closing ')'
    fields = stat[stat.rindex(")") + 2 :].split()
    return sum(int(f) for f in fields[11:last])  # utime, stime, cutime, cstime (fields 14-17)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of ``pid``'s process tree so far: all threads, and children that
    have exited (Postgres backends come and go)."""
    ticks = 0
    for member in process_tree(pid):
        try:
            stat = Path(f"/proc/{member}/stat").read_text()
        except OSError:
            continue
        ticks += _stat_ticks(stat, 15)
    return ticks / _CLOCK_TICKS


#: The name a process's main thread is reported under (with ``-w 1`` it runs the Bytewax worker).
MAIN_THREAD = "main"


def thread_cpu(pid: int) -> dict[int, tuple[str, float]]:
    """Each live thread of ``pid`` (not its children): tid → (name, user + system CPU seconds).
    The main thread is :data:`MAIN_THREAD` whatever its ``comm``."""
    out: dict[int, tuple[str, float]] = {}
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            tid = int(task.name)
            name = (task / "comm").read_text().strip()
            ticks = _stat_ticks((task / "stat").read_text(), 13)
        except (OSError, ValueError):
            continue  # the thread ended meanwhile
        out[tid] = (MAIN_THREAD if tid == pid else name, ticks / _CLOCK_TICKS)
    return out


@dataclass(frozen=True)
class ProcessCpu:
    """One walflow process's CPU at one moment: the process tree's and each thread's."""

    pid: int
    total: float
    threads: dict[int, tuple[str, float]]

    @classmethod
    def take(cls, pid: int) -> ProcessCpu:
        return cls(pid, cpu_seconds(pid), thread_cpu(pid))

    def since(self, start: ProcessCpu | None) -> tuple[float, dict[str, tuple[int, float]]]:
        """CPU seconds since ``start`` (None: since the process began): the process's, and per
        thread name (threads of one name summed: name → (how many threads, seconds)). A thread
        that began after ``start`` counts from zero; one that ended before now is only in the
        process's figure (the kernel adds an ended thread's time to its process)."""
        before = start.threads if start is not None else {}
        named: dict[str, tuple[int, float]] = {}
        for tid, (name, seconds) in self.threads.items():
            earlier = before.get(tid)
            spent = seconds - (earlier[1] if earlier is not None and earlier[0] == name else 0.0)
            count, total = named.get(name, (0, 0.0))
            named[name] = (count + 1, total + spent)
        return self.total - (start.total if start is not None else 0.0), named


@dataclass(frozen=True)
class CpuSnapshot:
    """CPU seconds so far: the whole machine's busy and total, and this benchmark's process tree's
    (which holds everything it started: the servers, walflow, pg_recvlogical, its own threads)."""

    busy: float
    total: float
    ours: float

    @classmethod
    def take(cls) -> CpuSnapshot:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
        idle = fields[3] + fields[4]  # idle, iowait
        return cls((sum(fields) - idle) / _CLOCK_TICKS, sum(fields) / _CLOCK_TICKS, cpu_seconds(os.getpid()))

    def shares_since(self, start: CpuSnapshot) -> dict[str, float]:
        """How busy the machine was since ``start``, and how much of it was someone else's:
        ``machine_cpu_busy`` near 1.0 means the figures include waiting for a core; a large
        ``other_processes_cpu`` share means something outside the benchmark (another job) took CPU meanwhile."""
        total = max(self.total - start.total, 1e-9)
        busy = self.busy - start.busy
        return {
            "machine_cpu_busy": round(busy / total, 2),
            "other_processes_cpu": round(max(busy - (self.ours - start.ours), 0.0) / total, 2),
        }


class Sampler(threading.Thread):
    """Base: calls ``sample`` every ``interval`` seconds until ``stop``; times are relative to start."""

    def __init__(self, interval: float) -> None:
        super().__init__(daemon=True, name=type(self).__name__)
        self.interval = interval
        self.started = time.monotonic()
        self.error: BaseException | None = None
        self._stopping = threading.Event()

    def run(self) -> None:
        try:
            self._loop()
        except BaseException as exc:  # noqa: BLE001 - reported by stop()
            self.error = exc

    def _loop(self) -> None:
        """Sample every ``interval``, and once more when stopped: a run shorter than a few
        intervals still ends with its final state (a slot that caught up, say)."""
        self.sample(time.monotonic() - self.started)
        while True:
            stopping = self._stopping.wait(self.interval)
            self.sample(time.monotonic() - self.started)
            if stopping:
                return

    def sample(self, at: float) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        self._stopping.set()
        self.join(10)
        if self.error is not None:
            raise RuntimeError(f"{type(self).__name__} failed: {self.error}") from self.error


class MemorySampler(Sampler):
    """Peak resident memory per process tree and of all of them together, every 100 ms."""

    def __init__(self, pids: list[int], interval: float = 0.1) -> None:
        super().__init__(interval)
        self.pids = pids
        self.peak_each: dict[int, int] = {}
        self.peak_total = 0

    def sample(self, at: float) -> None:
        sizes = {pid: rss_bytes(pid) for pid in self.pids}
        for pid, size in sizes.items():
            self.peak_each[pid] = max(self.peak_each.get(pid, 0), size)
        self.peak_total = max(self.peak_total, sum(sizes.values()))

    @property
    def peak_process(self) -> int:
        """The largest any one process tree got: what a per-process memory target is about."""
        return max(self.peak_each.values(), default=0)


class SlotLagSampler(Sampler):
    """``pg_current_wal_lsn() - confirmed_flush_lsn`` of one slot every 250 ms: how far the
    slot trails the server, i.e. the WAL Postgres must keep for it. The confirmed LSN itself
    is kept beside it: where little WAL is written (a backfill writes only its watermarks)
    the lag stays small even if the slot stood still, so only the LSN shows it moving."""

    def __init__(self, dsn: str, slot: str, interval: float = 0.25) -> None:
        super().__init__(interval)
        self.dsn = dsn
        self.slot = slot
        self.series: list[tuple[float, int]] = []
        self.confirmed: list[tuple[float, int]] = []

    def run(self) -> None:
        try:
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                self._conn = conn
                self._loop()
        except BaseException as exc:  # noqa: BLE001 - reported by stop()
            self.error = exc

    def sample(self, at: float) -> None:
        row = self._conn.execute(
            "SELECT (pg_current_wal_lsn() - confirmed_flush_lsn)::bigint, (confirmed_flush_lsn - '0/0')::bigint "
            "FROM pg_replication_slots WHERE slot_name = %s",
            [self.slot],
        ).fetchone()
        if row is not None and row[0] is not None:
            self.series.append((round(at, 3), int(row[0])))
            self.confirmed.append((round(at, 3), int(row[1])))

    def progress(self, start: float, end: float) -> dict[str, float | int | None]:
        """How the confirmed LSN moved between ``start`` and ``end`` (seconds on this sampler's
        clock): how often it advanced, the longest it stood still, the most the slot trailed."""
        window = [(t, lsn) for t, lsn in self.confirmed if start <= t <= end]
        moves, still, since = 0, 0.0, start
        for (_, before), (t, lsn) in itertools.pairwise(window):
            if lsn > before:
                moves += 1
                still, since = max(still, t - since), t
        lags = [b for t, b in self.series if start <= t <= end]
        return {
            "slot_confirmed_moves": moves,
            "slot_confirmed_still_max_s": round(max(still, end - since), 3) if window else None,
            "slot_lag_max_mb": round(max(lags) / 2**20, 3) if lags else None,
        }
