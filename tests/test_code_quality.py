"""The code stays typed and lint-clean: ruff and mypy (strict) over the whole tree."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ["bench", "cli", "config", "core", "connectors", "dataflows", "demo", "embedded", "transforms", "tests"]


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *argv], cwd=ROOT, capture_output=True, text=True, check=False)


def test_ruff_finds_nothing() -> None:
    result = _run("ruff", "check", "--no-cache", *PACKAGES)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.slow
def test_mypy_strict_finds_nothing() -> None:
    result = _run("mypy", *PACKAGES)
    assert result.returncode == 0, result.stdout + result.stderr
