"""The PostgreSQL source: pgoutput decoding, the replication session, the Bytewax partition."""
