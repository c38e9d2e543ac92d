"""The NATS JetStream sink: publishing with acknowledgements, one partition per key range."""

from core.compiled import extend

extend(__path__, __name__)  # the compiled hot path, where built (core/compiled.py)
