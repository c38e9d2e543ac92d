"""The PostgreSQL source: pgoutput decoding, the replication session, the Bytewax partition."""

from core.compiled import extend

extend(__path__, __name__)  # the compiled hot path, where built (core/compiled.py)
