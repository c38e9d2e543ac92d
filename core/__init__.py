"""What every part of walflow shares and no part owns: events, ids, errors, the process runtime.

Nothing here knows Postgres's wire protocol, Bytewax or NATS: sources produce these
types, transforms and sinks consume them.
"""
