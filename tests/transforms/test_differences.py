"""The startup lines that name where a sink's messages differ from Sequin's."""

from __future__ import annotations

from tests.transforms.samples import make_database, make_sink
from transforms.differences import differences


def test_every_sink_hears_of_the_differences_that_always_apply() -> None:
    lines = differences(make_sink(), make_database())
    assert all(line.startswith("sink app-to-nats: differs from Sequin: ") for line in lines)
    text = "\n".join(lines)
    for topic in ("time and timetz", "100 hours", "changes the key", "escaped in subjects", "JetStream",
                  "backfill's reads", "record_pks", "non-transactional", "Nats-Msg-Id", "derived from the names"):
        assert topic in text


def test_sequins_msg_id_removes_that_line_and_tls_adds_one() -> None:
    sequin_ids = make_sink(destination={"type": "nats", "host": "nats", "msg_id": "sequin"})
    assert not any("Nats-Msg-Id" in line for line in differences(sequin_ids, make_database()))
    tls = make_sink(destination={"type": "nats", "host": "nats", "tls": True})
    assert any("tls_ca_file" in line for line in differences(tls, make_database()))
    assert not any("tls_ca_file" in line for line in differences(make_sink(), make_database()))


def test_ids_in_the_file_remove_the_derived_ids_line() -> None:
    both = differences(make_sink(id="c0ffee00-0000-4000-8000-000000000001"),
                       make_database(id="c0ffee00-0000-4000-8000-000000000002"))
    assert not any("derived from the names" in line for line in both)
    assert any("derived from the names" in line
               for line in differences(make_sink(id="c0ffee00-0000-4000-8000-000000000001"), make_database()))
