"""Throwaway PostgreSQL and NATS servers for the test suite and the demo (one module, both users)."""

from embedded._process import ServerError, wait_for
from embedded.nats import NatsNotFound, NatsServer
from embedded.postgres import PostgresNotFound, PostgresServer

__all__ = ["NatsNotFound", "NatsServer", "PostgresNotFound", "PostgresServer", "ServerError", "wait_for"]
