"""What every part of walflow shares and no part owns: events, ids, errors, the process runtime.

Nothing here knows Postgres's wire protocol or NATS: sources produce these types,
transforms and sinks consume them. Two modules deal with the engine every part runs on:
``threads`` and ``pacing`` work around Bytewax 0.21.1's per-item thread states and its
spinning sources, for any source or sink.
"""

from core.compiled import extend

extend(__path__, __name__)  # the compiled hot path, where built (core/compiled.py)
