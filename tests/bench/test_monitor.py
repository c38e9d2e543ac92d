"""bench/monitor.py: a process tree read while its processes come and go."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.monitor import process_tree


def test_a_process_that_ends_while_its_tasks_are_listed_is_only_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    """/proc/<pid>/task existed when glob looked, and was gone when it read it (a bench run ended so)."""
    glob = Path.glob

    def racing(self: Path, pattern: str) -> Iterator[Path]:
        if self == Path("/proc/424242/task"):
            raise FileNotFoundError(2, "No such file or directory", str(self))
        return glob(self, pattern)

    monkeypatch.setattr(Path, "glob", racing)
    assert process_tree(424242) == [424242]


def test_a_live_tree_holds_its_children() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert child.pid in process_tree(os.getpid())
    finally:
        child.kill()
        child.wait()
