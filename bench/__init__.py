"""walflow's benchmark: ``./run.sh bench [--quick]`` (``python -m bench``).

It starts its own PostgreSQL and NATS, writes the workloads (:mod:`bench.workloads`) once, and runs every
consumer over the same WAL: ``pg_recvlogical`` (the source ceiling), walflow end to end in
several deployments (``-s 1``, no flags at all, ``-w 2``, 2 and 3 processes), and two
publishers replaying walflow's own messages (the sink ceiling). Each walflow run's CPU is
read per process and per thread; from the multi-process runs it projects one slot's rate
with N publishing processes (``bench.report.scaling``). Then it measures latency
at fixed offered rates with walflow running live, with ``pgbench`` as the load, backfills:
a table of existing rows read into JetStream, beside ``COPY`` of the same table
(``bench/backfill.py``), and one flow reading two databases. Results go to
``bench/results/<date>.{json,md,png}``.
"""
