"""Names the database chose (a table's) and the operator's (a config's path) reach ``walflow check`` and
``walflow status`` escaped: an ESC sequence in one cannot clear the screen, retitle the window or
forge a line. ``--json`` carries them exactly, as JSON escapes them."""

from __future__ import annotations

from pathlib import Path

from psycopg import sql

from tests.cli.helpers import run_both, status
from tests.harness import Database, Nats, TestNames
from tests.workload import setup_events

#: Clears the screen, sets the window's title, then a line that would read as walflow's own.
HOSTILE = "evil\x1b[2J\x1b]0;owned\x07\n  ok   all good"
SHOWN = "evil\\x1b[2J\\x1b]0;owned\\x07\\x0a  ok   all good"


def test_a_table_name_with_escape_sequences_is_escaped_by_check(
    database: Database, names: TestNames, nats_srv: Nats, stream_cleanup: str, tmp_path: Path
) -> None:
    config = setup_events(database, names, nats_srv, tmp_path)
    with database.connect() as conn:
        conn.execute(sql.SQL("CREATE TABLE {} (id int)").format(sql.Identifier(HOSTILE)))
        conn.execute(sql.SQL("ALTER PUBLICATION {} ADD TABLE {}").format(sql.Identifier(names.publication),
                                                                        sql.Identifier(HOSTILE)))
    out = run_both("check", config)
    assert "\x1b" not in out.text and "\x07" not in out.text, out.text  # not a terminal: no colours either
    assert f"public.{SHOWN} (no primary key)" in out.text, out.text
    assert any(f"public.{HOSTILE} (no primary key)" in text for text in out.levels("fail")), out.findings


def test_a_config_path_with_escape_sequences_is_escaped_by_status(
    database: Database, names: TestNames, nats_srv: Nats, tmp_path: Path
) -> None:
    directory = tmp_path / "cfg\x1b]0;owned\x07"
    directory.mkdir()
    config = setup_events(database, names, nats_srv, directory)
    out = status(config)
    assert "\x1b" not in out.text and "\x07" not in out.text, out.text
    assert "cfg\\x1b]0;owned\\x07" in out.text, out.text
    assert out.data["config"] == str(config)
