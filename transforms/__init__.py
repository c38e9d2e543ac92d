"""Per-change steps between source and sink: filter, group, envelope, route."""

from core.compiled import extend

extend(__path__, __name__)  # the compiled hot path, where built (core/compiled.py)
