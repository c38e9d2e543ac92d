"""docs/configuration.md is what the schema generates now, and the generator reads the schema right."""

from __future__ import annotations

import pytest

from config import reference
from config.schema import NatsDestination, Section, SinkConfig, StreamConfig, TableConfig, WalflowSettings
from config.shaping import Columns, Condition, RoutingFunction, SubjectRouting, elixir_refused


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
        for name, field in section.model.model_fields.items():
            assert f"| `{field.alias or name}` |" in text, (section.path, name)
    assert "| `in` |" in text and "| `in_` |" not in text  # a key as the file spells it


def test_each_form_of_a_key_and_each_mapped_section_has_a_section_of_its_own() -> None:
    found = {(s.path, s.model): s for s in reference.sections()}
    subject, python = found["sinks[].routing", SubjectRouting], found["sinks[].routing", RoutingFunction]
    assert (subject.title, subject.anchor) == ("`sinks[].routing` (`subject:` form)", "sinks-routing-subject-form")
    assert (python.title, python.anchor) == ("`sinks[].routing` (`python:` form)", "sinks-routing-python-form")
    assert len({s.anchor for s in found.values()}) == len({s.key for s in found.values()}) == len(found)
    text = reference.render()
    routing = next(line for line in text.splitlines() if line.startswith("| `routing` |") and "sinks-routing" in line)
    assert "(#sinks-routing-subject-form)" in routing and "(#sinks-routing-python-form)" in routing
    mask = next(s for s in found.values() if s.path.endswith(".mask.<column>"))
    assert mask.path == "sinks[].tables[].columns.mask.<column>"
    assert f"| `mask` | mapping of column name to section [{mask.title}](#{mask.anchor}) |" in text
    assert "ssn: redact" in reference.EXAMPLES[mask.key] and "email: hash" in reference.EXAMPLES[mask.key]
    condition = found["sinks[].tables[].where[]", Condition]
    assert f"| `any` | list of section [{condition.title}](#{condition.anchor}) (not empty), or null |" in text


def test_descriptions_come_from_field_descriptions_then_comments_then_type_aliases() -> None:
    assert reference.description(WalflowSettings, "log_format").startswith("``text``: one ``key=value`` line")
    assert reference.description(StreamConfig, "duplicate_window_ms").startswith("JetStream drops a re-published")
    assert reference.description(SinkConfig, "transform").startswith("The payload: the envelope")
    assert reference.description(NatsDestination, "host") == ""
    # a field's comment, then its type alias's, from the module that defines the alias
    toast = reference.description(TableConfig, "toast")
    assert toast.startswith("Unchanged TOAST values") and "``omit`` leaves the column out" in toast
    assert reference.description(Condition, "in_") == "The value is one of these."


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
    assert kind(Columns, "rename") == "mapping of string to string"
    assert kind(Condition, "eq") == "any value"
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
    # a Sequin function name was refused before functions: were read; walflow's form in place never is
    monkeypatch.setitem(reference.REFUSED, "sinks[]", [reference.Refusal("transform", {"path": "record"})])
    with pytest.raises(reference.GenerationError,
                       match=r"sinks\[0\].transform: \{'path': 'record'\} is no longer refused"):
        reference.render()


def test_a_sink_naming_an_elixir_function_is_shown_refused_with_the_loaders_error() -> None:
    text = reference.render()
    assert f"| `filter: only-vip` | {elixir_refused('filter', 'only-vip')} |" in text
    assert "| `enrichment: order-total` | no function named 'order-total' in functions: (order-totals) |" in text


def test_a_refusal_for_another_reason_stops_generation(monkeypatch: pytest.MonkeyPatch) -> None:
    # what is beside it makes the file fail (a second sink of the same name), not the key shown
    twin = {"sinks": [{}, reference.BASE["sinks"][0]]}
    monkeypatch.setitem(reference.REFUSED, "sinks[]", [reference.Refusal("database", "app", twin)])
    with pytest.raises(reference.GenerationError, match=r"(?s)sinks\[0\].database is refused, but not by name: .*used twice"):
        reference.render()
