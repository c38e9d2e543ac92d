"""The startup lines that name where a sink's messages differ from Sequin's."""

from __future__ import annotations

from tests.transforms.samples import make_sink
from transforms.differences import differences


def test_every_sink_hears_of_the_differences_that_always_apply() -> None:
    lines = differences(make_sink())
    assert all(line.startswith("sink app-to-nats: differs from Sequin: ") for line in lines)
    text = "\n".join(lines)
    for topic in ("time and timetz", "changes the key", "escaped in subjects", "JetStream", "backfill's reads",
                  "Nats-Msg-Id"):
        assert topic in text


def test_sequins_msg_id_removes_that_line_and_tls_adds_one() -> None:
    sequin_ids = make_sink(destination={"type": "nats", "host": "nats", "msg_id": "sequin"})
    assert not any("Nats-Msg-Id" in line for line in differences(sequin_ids))
    tls = make_sink(destination={"type": "nats", "host": "nats", "tls": True})
    assert any("tls_ca_file" in line for line in differences(tls))
    assert not any("tls_ca_file" in line for line in differences(make_sink()))
