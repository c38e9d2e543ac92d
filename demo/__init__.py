"""``./run.sh demo``: throwaway PostgreSQL and NATS, a demo schema, the real dataflow, live events."""
