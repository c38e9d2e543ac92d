"""Transaction markers end to end: BEGIN and END around each transaction the sink publishes
anything of, in stream order, with what was published counted; none for a transaction the
sink filters out. Once per-message (markers are barriers) with Sequin's envelope, once in
atomic batches with Debezium's, whose events then carry their place in the transaction."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.harness import Database, Nats, TestNames
from tests.pipeline import run_workload, stored, write_config


@pytest.mark.slow
@pytest.mark.parametrize(("transactions", "envelope"), [("none", "sequin"), ("atomic", "debezium")])
def test_markers_surround_each_published_transaction(transactions: str, envelope: str, database: Database,
                                                     names: TestNames, nats_srv: Nats, stream_cleanup: str,
                                                     tmp_path: Path) -> None:
    with database.connect() as conn:
        conn.execute("CREATE TABLE accounts (id int PRIMARY KEY, balance int)")
        conn.execute("CREATE TABLE ledger (id int PRIMARY KEY, note text)")
        conn.execute("CREATE TABLE busy (id int PRIMARY KEY)")
        conn.execute(f"CREATE PUBLICATION {names.publication} FOR TABLE accounts, ledger")
    sink = {"name": "m", "transaction_markers": True, "transactions": transactions, "envelope": envelope,
            "actions": ["insert", "update"],
            "destination": {"subject_prefix": names.subject_prefix, "stream": {"name": names.stream}}}
    config = write_config(tmp_path, database, nats_srv, names, [sink])

    def workload(conn: object) -> None:
        with database.connect() as c:
            with c.transaction():
                c.execute("INSERT INTO accounts VALUES (1, 10), (2, 20), (3, 30)")
                c.execute("INSERT INTO ledger VALUES (1, 'opened')")
            c.execute("DELETE FROM accounts WHERE id = 3")  # the sink publishes no deletes: no markers
            c.execute("INSERT INTO busy VALUES (1)")  # not in the publication
            with c.transaction():
                c.execute("UPDATE accounts SET balance = balance - 5 WHERE id = 1")
                c.execute("UPDATE accounts SET balance = balance + 5 WHERE id = 2")

    run_workload(config, database, workload)
    events = stored(nats_srv.url, names.stream)
    prefix = f"{names.subject_prefix}.shop"
    kinds = [e.subject.removeprefix(prefix + ".") for e in events]
    assert kinds == ["_transaction.begin", *["public.accounts.insert"] * 3, "public.ledger.insert",
                     "_transaction.end", "_transaction.begin", *["public.accounts.update"] * 2, "_transaction.end"]
    ends = [e.event for e in events if e.subject.endswith("_transaction.end")]
    assert [(end["event_count"], end["data_collections"]) for end in ends] == [
        (4, [{"data_collection": "public.accounts", "event_count": 3},
             {"data_collection": "public.ledger", "event_count": 1}]),
        (2, [{"data_collection": "public.accounts", "event_count": 2}])]
    begins = [e.event for e in events if e.subject.endswith("_transaction.begin")]
    assert [b["id"] for b in begins] == [end["id"] for end in ends] and begins[0]["status"] == "BEGIN"
    xid, lsn = ends[0]["id"].split(":")
    assert int(xid) > 0 and int(lsn) > 0
    changes = [e for e in events if "_transaction" not in e.subject]
    if envelope == "debezium":
        assert [e.event["transaction"] for e in changes[:4]] == [
            {"id": ends[0]["id"], "total_order": n, "data_collection_order": d} for n, d in ((1, 1), (2, 2), (3, 3),
                                                                                            (4, 1))]
        assert all("Nats-Batch-Id" in e.headers for e in events)  # markers go in their transaction's batch
        assert events[-1].headers.get("Nats-Batch-Commit") == "1"
    else:
        assert all(json.loads(e.data)["metadata"]["commit_lsn"] == int(lsn) for e in changes[:4])
