"""docs/configuration.md is what the schema generates now, and the generator reads the schema right."""

from __future__ import annotations

import pytest

from config import reference
from config.schema import NatsDestination, Section, SinkConfig, StreamConfig, WalflowSettings


def test_the_reference_is_current() -> None:
    expected = reference.render()
    written = reference.OUTPUT.read_text(encoding="utf-8") if reference.OUTPUT.exists() else ""
    assert written == expected, (
        f"{reference.OUTPUT.name} differs from what config/schema.py generates: "
        f"run `{reference.COMMAND}` and commit docs/configuration.md"
    )


def test_every_section_and_key_is_in_it() -> None:
    text = reference.render()
    for section in reference.sections():
        assert f"## {section.title}\n" in text
        for name in section.model.model_fields:
            assert f"| `{name}` |" in text, (section.path, name)


def test_descriptions_come_from_field_descriptions_then_comments_then_type_aliases() -> None:
    assert reference.description(WalflowSettings, "log_format").startswith("``text``: one ``key=value`` line")
    assert reference.description(StreamConfig, "duplicate_window_ms").startswith("JetStream drops a re-published")
    assert reference.description(SinkConfig, "transform").startswith("Sequin functions are Elixir code")
    assert reference.description(NatsDestination, "host") == ""


def test_types_constraints_and_defaults_read_from_pydantic() -> None:
    links: dict[type[Section], str] = {StreamConfig: "section [stream](#s)"}

    def kind(model: type[Section], name: str) -> str:
        field = model.model_fields[name]
        return reference.type_text(field.annotation, list(field.metadata), links)

    assert kind(NatsDestination, "port") == "integer (≥ 1, ≤ 65535)"
    assert kind(NatsDestination, "msg_id") == "one of `walflow`, `sequin`"
    assert kind(NatsDestination, "password") == "string, secret (never shown in logs or errors), or null"
    assert kind(NatsDestination, "stream") == "section [stream](#s)"
    assert kind(NatsDestination, "subject_prefix").startswith("string (a valid subject prefix: ")
    assert kind(SinkConfig, "actions") == "list, each one of `insert`, `update`, `delete` (not empty)"
    assert reference.default_text(SinkConfig.model_fields["actions"]) == "`[insert, update, delete]`"
    assert reference.default_text(SinkConfig.model_fields["name"]) == "**required**"


def test_an_example_that_does_not_load_stops_generation(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(reference.EXAMPLES, "walflow.health", "walflow:\n  health: {port: 0}\n")
    with pytest.raises(reference.GenerationError, match="example of section 'walflow.health'.*does not load"):
        reference.render()


def test_an_example_that_warns_stops_generation(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(reference.EXAMPLES, "sinks[]", reference.EXAMPLES["sinks[]"] + "    batch_size: 10\n")
    with pytest.raises(reference.GenerationError, match=r"example of section 'sinks\[\]'.*warns: .*batch_size"):
        reference.render()


def test_a_key_no_longer_refused_stops_generation(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(reference.REFUSED, "sinks[]", [("transform", "none")])
    with pytest.raises(reference.GenerationError, match=r"sinks\[0\].transform: 'none' is no longer refused"):
        reference.render()
