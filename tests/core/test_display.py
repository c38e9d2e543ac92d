"""``core.display``: URLs shown without their credentials, text without what a terminal would act on."""

from __future__ import annotations

import logging

import pytest

from core.display import display_url, fatal_line, printable
from core.errors import FatalError
from dataflows.logs import LogfmtFormatter


@pytest.mark.parametrize(("url", "shown"), [
    ("nats://user:pa55@nats-1:4222", "nats://nats-1:4222"),
    ("nats://s3cr3t-token@nats-1:4222", "nats://nats-1:4222"),
    ("tls://user:pa/ss?w#rd@nats-1:4222/path?q=1#f", "tls://nats-1:4222"),  # a password with / ? # unencoded
    ("nats://nats-1", "nats://nats-1"),
    ("nats://user:pw@[::1]:4222", "nats://[::1]:4222"),
    ("http://monitor:pw@nats-1:8222/", "http://nats-1:8222"),
    ("user:pw@nats-1:4222", "nats-1:4222"),  # nats-py reads a URL without a scheme as nats://
    ("postgres://role:pw@db:5432/shop?sslpassword=x", "postgres://db:5432"),
])
def test_a_url_is_shown_as_scheme_host_and_port(url: str, shown: str) -> None:
    assert display_url(url) == shown


def test_printable_escapes_what_a_terminal_acts_on() -> None:
    title = "orders\x1b]0;owned\x07\x1b[2J\r\n\u202etxt.exe\x7f\x9b"
    assert printable(title) == "orders\\x1b]0;owned\\x07\\x1b[2J\\x0d\\x0a\\u202etxt.exe\\x7f\\x9b"
    assert printable("naïve 表 tables, quoted \"x\" and \\ kept") == "naïve 表 tables, quoted \"x\" and \\ kept"
    assert printable("a\nb\tc\x1b", keep="\n\t") == "a\nb\tc\\x1b"
    assert printable("\U000e0001") == "\\U000e0001"  # a tag character (format, invisible)


def test_a_fatal_line_keeps_its_lines_and_escapes_the_rest() -> None:
    error = FatalError("invalid walflow config x.yaml:\n  sinks[0].table: 'public.\x1b[31mred' is not published\n\tHINT")
    assert fatal_line(error) == ("walflow: invalid walflow config x.yaml:\n  sinks[0].table: 'public.\\x1b[31mred' is "
                                 "not published\n\tHINT")


def test_the_text_log_format_escapes_control_characters_as_json_does() -> None:
    """The human log format writes each value as JSON, which escapes them: nothing to add there."""
    record = logging.LogRecord("walflow.postgres", logging.WARNING, __file__, 1, "table %s has no key", ("t\x1b[2J",),
                               None)
    record.table = "t\x1b]0;x\x07"
    line = LogfmtFormatter().format(record)
    assert "\x1b" not in line and "\x07" not in line
    assert 'msg="table t\\u001b[2J has no key"' in line and 'table="t\\u001b]0;x\\u0007"' in line
