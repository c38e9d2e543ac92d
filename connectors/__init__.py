"""Connectors: where walflow meets the outside world.

``connectors.postgres`` reads the logical replication slot (the Bytewax source);
``connectors.nats`` publishes to JetStream (the Bytewax sink).
"""
