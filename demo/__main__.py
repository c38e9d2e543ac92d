"""The demo: everything a newcomer needs to see walflow work, in one command.

Starts a throwaway PostgreSQL (wal_level=logical) and NATS with JetStream, creates a small
schema, runs the real dataflow (``python -m bytewax.run dataflows.cdc``) as a child
process, writes a few changes a second and prints every event as it arrives in JetStream.
Ctrl-C (or ``--seconds N``) stops everything and leaves no process behind.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from pathlib import Path

import nats
import psycopg
from nats.js.api import DeliverPolicy

from embedded import NatsServer, PostgresServer, ServerError
from embedded._process import Account, ServerProcess

ROOT = Path(__file__).resolve().parent.parent

SCHEMA = """
CREATE TABLE customers (id serial PRIMARY KEY, name text NOT NULL, email text);
CREATE TABLE orders (
    id serial PRIMARY KEY, customer_id int REFERENCES customers, status text NOT NULL,
    amount numeric(10, 2) NOT NULL, created_at timestamptz NOT NULL DEFAULT now()
);
-- customers from before walflow started: the sink's initial backfill publishes them as reads
INSERT INTO customers (name, email) VALUES ('Alan', 'alan@example.com'), ('Hedy', 'hedy@example.com');
"""

CONFIG = """\
databases:
  - name: demo
    hostname: 127.0.0.1
    port: {pg_port}
    database: postgres
    username: postgres
    slot: {{ name: walflow_demo, create_if_not_exists: true }}
    publication: {{ name: walflow_demo, create_if_not_exists: true }}
sinks:
  - name: demo-to-nats
    database: demo
    initial_backfill: true
    destination:
      type: nats
      host: 127.0.0.1
      port: {nats_port}
      username: {nats_user}
      password: ${{WALFLOW_DEMO_NATS_PASSWORD}}
walflow:
  log_level: warning
"""

NAMES = ["Ada", "Grace", "Linus", "Barbara", "Edsger", "Margaret", "Ken", "Frances"]


def _show(data: bytes, subject: str, seq: int) -> str:
    event = json.loads(data)
    meta = event["metadata"]
    line = f"#{seq:<4} {event['action']:<6} {meta['table_schema']}.{meta['table_name']:<10} {json.dumps(event['record'])}"
    if event.get("changes"):
        line += f"  was {json.dumps(event['changes'])}"
    return f"{line}\n      subject={subject}  commit_lsn={meta['commit_lsn']}"


async def _print_events(url: str, stop: asyncio.Event, seen: list[int]) -> None:
    nc = await nats.connect(url, max_reconnect_attempts=-1)
    try:
        js = nc.jetstream()
        while not stop.is_set():  # the pipeline creates the stream: wait for it
            try:
                await js.stream_info("WALFLOW")
                break
            except nats.js.errors.NotFoundError:
                await asyncio.sleep(0.2)
        sub = await js.subscribe("sequin.demo.>", stream="WALFLOW", ordered_consumer=True,
                                 deliver_policy=DeliverPolicy.ALL)
        while not stop.is_set():
            try:
                msg = await sub.next_msg(timeout=0.5)
            except nats.errors.TimeoutError:
                continue
            seen.append(msg.metadata.sequence.stream)
            print(_show(msg.data, msg.subject, msg.metadata.sequence.stream), flush=True)
    finally:
        await nc.close()


async def _write_changes(dsn: str, stop: asyncio.Event) -> None:
    """A customer signs up, orders, pays; now and then an order is cancelled (deleted)."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        while not stop.is_set():  # changes count from the moment the pipeline holds its slot
            cur = await conn.execute("SELECT 1 FROM pg_replication_slots WHERE slot_name = 'walflow_demo' AND active")
            if await cur.fetchone():
                break
            await asyncio.sleep(0.1)
        print("walflow demo: the pipeline is streaming; writing changes\n", flush=True)
        i = 0
        while not stop.is_set():
            name = NAMES[i % len(NAMES)]
            cur = await conn.execute(
                "INSERT INTO customers (name, email) VALUES (%s, %s) RETURNING id", [name, f"{name.lower()}@example.com"]
            )
            customer = (await cur.fetchone() or [0])[0]
            async with conn.transaction():
                cur = await conn.execute(
                    "INSERT INTO orders (customer_id, status, amount) VALUES (%s, 'new', %s) RETURNING id",
                    [customer, 10 + i * 2.5],
                )
                order = (await cur.fetchone() or [0])[0]
            await asyncio.sleep(0.7)
            await conn.execute("UPDATE orders SET status = 'paid' WHERE id = %s", [order])
            if i % 3 == 2:
                await asyncio.sleep(0.7)
                await conn.execute("DELETE FROM orders WHERE id = %s", [order])
            i += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0)


async def _run(seconds: float | None, pipeline: ServerProcess, dsn: str, url: str) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    seen: list[int] = []
    tasks = [asyncio.create_task(_print_events(url, stop, seen)), asyncio.create_task(_write_changes(dsn, stop))]
    deadline = time.monotonic() + seconds if seconds else None
    while not stop.is_set():
        if not pipeline.running:
            print(f"\nwalflow: the pipeline stopped:\n{pipeline.log_tail()}", file=sys.stderr)
            stop.set()
            await asyncio.gather(*tasks, return_exceptions=True)
            return 1
        if deadline is not None and time.monotonic() >= deadline:
            break
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.2)
    stop.set()
    await asyncio.gather(*tasks)
    print(f"\nwalflow demo: {len(seen)} events arrived in JetStream stream WALFLOW. Stopped.")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(prog="./run.sh demo", description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, help="stop by itself after this many seconds")
    args = parser.parse_args()
    try:
        pg_server, nats_server = PostgresServer(), NatsServer()
    except ServerError as exc:
        print(f"walflow: {exc}", file=sys.stderr)
        return 1
    with pg_server as pg, nats_server as nc:
        with psycopg.connect(pg.dsn(), autocommit=True) as conn:
            conn.execute(SCHEMA)
        assert nc.base is not None
        config = nc.base / "walflow-demo.yaml"
        config.write_text(CONFIG.format(pg_port=pg.port, nats_port=nc.port, nats_user=nc.login["username"]))
        pipeline = ServerProcess(
            [sys.executable, "-m", "bytewax.run", "dataflows.cdc", "-s", "1"],
            log_path=nc.base / "pipeline.log",
            cwd=ROOT,
            account=Account(os.geteuid(), os.getegid(), "self"),
            # the servers' passwords reach walflow through libpq's passfile and the environment, never the config file
            env={**os.environ, "WALFLOW_CONFIG": str(config), "PGPASSFILE": str(pg.passfile),
                 "WALFLOW_DEMO_NATS_PASSWORD": nc.login["password"]},
        )
        print(f"walflow demo: PostgreSQL on 127.0.0.1:{pg.port}, NATS on {nc.address}")
        print("walflow demo: tables public.customers and public.orders -> subjects sequin.demo.public.<table>.<action> (Sequin's)")
        print("walflow demo: the 2 customers that exist already arrive first, as reads (initial_backfill: true)")
        print("walflow demo: events below arrive from JetStream, in order per row (Ctrl-C stops everything)")
        pipeline.start()
        try:
            return asyncio.run(_run(args.seconds, pipeline, pg.dsn(), nc.url))
        finally:
            pipeline.stop(signal.SIGTERM, timeout=10)


if __name__ == "__main__":
    raise SystemExit(main())
