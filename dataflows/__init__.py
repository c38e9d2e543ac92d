"""Dataflows: ``dataflows.cdc`` wires source, transforms and sinks; it holds no logic of its own."""
