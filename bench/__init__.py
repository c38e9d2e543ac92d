"""walflow's benchmark: ``./run.sh bench [--quick]`` (``python -m bench``).

It starts its own PostgreSQL and NATS, writes the workloads of issue 7 once, and runs every
consumer over the same WAL: ``pg_recvlogical`` (the source ceiling), walflow end to end in
three deployments, and two publishers replaying walflow's own messages (the sink ceiling).
Then it measures latency at fixed offered rates with walflow running live, with ``pgbench``
as the load, and backfills (issue 12): a table of existing rows read into JetStream, beside
``COPY`` of the same table (``bench/backfill.py``). Results go to
``bench/results/<date>.{json,md,png}``.
"""
