"""Per-change steps between source and sink: filter, group, envelope, route."""
