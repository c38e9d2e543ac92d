"""Log lines: the text and JSON formats, records held until the format is known, and a JSON pipeline."""

from __future__ import annotations

import json
import logging
import sys
import warnings
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from dataflows.logs import JsonFormatter, LogfmtFormatter, configure_logging, held_until_configured
from embedded import wait_for
from tests.harness import Database, Nats, TestNames
from tests.harness import slot_active as _slot_active
from tests.harness import slot_confirmed as _confirmed
from tests.pipeline import assert_running, pipeline, write_config

#: 2026-12-01T10:00:00.123Z
_CREATED = datetime(2026, 12, 1, 10, 0, 0, 123000, tzinfo=UTC).timestamp()


def _record(message: str = "slot %s lag %d bytes", *args: object, level: int = logging.WARNING,
            extra: dict[str, Any] | None = None, error: bool = False) -> logging.LogRecord:
    exc_info = None
    if error:
        try:
            raise ValueError("boom")
        except ValueError:
            exc_info = sys.exc_info()
    record = logging.getLogger("walflow.postgres").makeRecord(
        "walflow.postgres", level, __file__, 1, message, args or ("s1", 42), exc_info, extra=extra,
    )
    record.created, record.msecs = _CREATED, 123.0
    return record


@pytest.fixture
def restored_logging() -> Iterator[None]:
    """configure_logging changes process-wide state: put it back for the other tests."""
    root, walflow = logging.getLogger(), logging.getLogger("walflow")
    handlers, level, walflow_level = root.handlers[:], root.level, walflow.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    walflow.setLevel(walflow_level)
    logging.captureWarnings(False)


def test_text_lines_are_as_before() -> None:
    assert LogfmtFormatter().format(_record()) == (
        'ts=2026-12-01T10:00:00.123Z level=warning logger=walflow.postgres msg="slot s1 lag 42 bytes"'
    )


def test_text_lines_carry_extras_and_errors() -> None:
    line = LogfmtFormatter().format(_record(extra={"slot": "s1", "lag_bytes": 42}, error=True))
    assert line.startswith('ts=2026-12-01T10:00:00.123Z level=warning logger=walflow.postgres '
                           'msg="slot s1 lag 42 bytes" slot="s1" lag_bytes=42 error="Traceback')
    assert "\n" not in line and "ValueError: boom" in line


def test_json_lines_hold_time_level_logger_message_and_extras() -> None:
    line = JsonFormatter().format(_record(extra={"slot": "s1", "lag_bytes": 42}))
    assert "\n" not in line
    assert json.loads(line) == {
        "time": "2026-12-01T10:00:00.123Z", "level": "warning", "logger": "walflow.postgres",
        "message": "slot s1 lag 42 bytes", "slot": "s1", "lag_bytes": 42,
    }
    assert datetime.fromisoformat(json.loads(line)["time"]) == datetime.fromtimestamp(_CREATED, UTC)


def test_json_lines_hold_the_traceback_on_one_line() -> None:
    line = JsonFormatter().format(_record(error=True))
    assert "\n" not in line
    error = json.loads(line)["error"]
    assert error.startswith("Traceback (most recent call last):") and error.endswith("ValueError: boom")


def test_json_extras_never_replace_the_base_fields_and_any_value_is_written() -> None:
    entry = json.loads(JsonFormatter().format(_record(extra={"level": "info", "logger": "x", "path": Path("/a")})))
    assert (entry["level"], entry["logger"], entry["path"]) == ("warning", "walflow.postgres", "/a")


def test_json_lines_are_ascii_whatever_the_message() -> None:
    line = JsonFormatter().format(_record("table %s: %s", "café", 'a "quoted"\nline'))
    assert line.isascii()
    assert json.loads(line)["message"] == 'table café: a "quoted"\nline'


def _lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines()]


@pytest.mark.usefixtures("restored_logging")
def test_configure_json_levels_and_python_warnings(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("info", "json")
    logging.getLogger("walflow.nats").info("NATS reconnected")
    logging.getLogger("walflow.nats").debug("not at info")
    logging.getLogger("nats.aio").info("a library speaks from warning up")
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.warn("deprecated thing", DeprecationWarning, stacklevel=1)
    lines = _lines(capsys.readouterr().err)
    assert [(e["level"], e["logger"]) for e in lines] == [("info", "walflow.nats"), ("warning", "py.warnings")]
    assert "deprecated thing" in lines[1]["message"]


@pytest.mark.usefixtures("restored_logging")
def test_records_held_until_the_format_is_known(capsys: pytest.CaptureFixture[str]) -> None:
    with held_until_configured():
        logging.getLogger("walflow.config").warning("sinks[0].batch_size is ignored: walflow batches by itself")
        assert capsys.readouterr().err == ""
        configure_logging("warning", "json")
        logging.getLogger("walflow.sequin").warning("after")
    assert [e["message"] for e in _lines(capsys.readouterr().err)] == [
        "sinks[0].batch_size is ignored: walflow batches by itself", "after",
    ]


@pytest.mark.usefixtures("restored_logging")
def test_records_held_by_a_failed_load_come_out_as_text(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(RuntimeError), held_until_configured():
        logging.getLogger("walflow.config").warning("account is ignored: walflow has no accounts")
        raise RuntimeError("the config did not load")
    err = capsys.readouterr().err
    assert err.startswith("ts=") and 'msg="account is ignored: walflow has no accounts"' in err


@pytest.mark.slow
def test_a_json_pipeline_writes_only_json_lines_and_nothing_per_change(
    database: Database, names: TestNames, nats_srv: Nats, stream_cleanup: str, tmp_path: Path
) -> None:
    changes = 500
    with database.connect() as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, name text)")
    sink = {
        "name": "items-to-nats",
        "batch_size": 10,  # a Sequin key walflow ignores: its warning is logged while the config loads
        "destination": {"subject_prefix": names.subject_prefix, "stream": {"name": names.stream}},
    }
    config = write_config(tmp_path, database, nats_srv, names, [sink], log_format="json")
    log = config.with_suffix(".log")
    with pipeline(config, "-s", "1") as proc:
        wait_for(lambda: _slot_active(database) and "streaming slot" in log.read_text(), timeout=60,
                 what="the pipeline to stream its slot", check=lambda: assert_running(proc))
        before = len(log.read_text().splitlines())
        with database.connect() as conn:
            for i in range(changes):
                conn.execute("INSERT INTO items VALUES (%s, 'x')", [i])
            conn.execute("UPDATE items SET name = 'y'")
        end = database.current_lsn()
        wait_for(lambda: _confirmed(database) >= end, timeout=60, what="the slot to pass the writes",
                 check=lambda: assert_running(proc))
        during = len(log.read_text().splitlines()) - before
    text = log.read_text()
    entries = []
    for line in text.splitlines():
        try:
            entries.append(json.loads(line))
        except ValueError:
            pytest.fail(f"a line of the pipeline's log is not JSON: {line!r}\n{text}")
    assert all({"time", "level", "logger", "message"} <= entry.keys() for entry in entries), text
    assert any(e["level"] == "warning" and "batch_size is ignored" in e["message"] for e in entries), text
    # quiet when all is well: at info, a thousand changes add no line of their own
    assert during <= 2, text
