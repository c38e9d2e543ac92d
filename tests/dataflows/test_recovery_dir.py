"""The ``-r`` directory holds pickles of the flow's state (rows before masking): walflow makes it
readable by its user only, and says how to close one that others may enter."""

from __future__ import annotations

import logging
import stat
from pathlib import Path

import pytest

from dataflows.recovery import prepare


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_new_recovery_directory_and_its_files_are_this_users_only(tmp_path: Path) -> None:
    directory = tmp_path / "made" / "by" / "walflow" / "recovery"
    prepare(directory, 2)
    assert _mode(directory) == 0o700
    assert _mode(directory.parent) == 0o700  # the parents walflow made too
    files = [p for p in directory.rglob("*") if p.is_file()]
    assert len(files) == 2  # one sqlite file per partition
    assert all(_mode(p) & 0o077 == 0 for p in files), [(p.name, oct(_mode(p))) for p in files]


def test_an_existing_directory_open_to_others_is_warned_of_with_the_chmod(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    directory = tmp_path / "recovery dir"
    prepare(directory, 1)
    directory.chmod(0o755)
    with caplog.at_level(logging.WARNING, logger="walflow"):
        prepare(directory, 1)
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert "open to other users (mode 755)" in warning
    assert f"chmod -R go= '{directory}'" in warning
    caplog.clear()
    directory.chmod(0o700)
    with caplog.at_level(logging.WARNING, logger="walflow"):
        prepare(directory, 1)
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []
