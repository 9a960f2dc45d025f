"""schemas/EVENTS.md documents the models exactly: every field, every type, valid examples."""

from __future__ import annotations

import json
import re
import typing
from pathlib import Path

import pytest

from schemas.events import DEFAULT_TOPIC, EVENT_TYPES, PAYLOAD_MODELS, Event, Harness
from schemas.versions import MAX_EVENT_BYTES, SCHEMA_VERSION, validate_event

EVENT_MODELS = {typing.get_args(model.model_fields["type"].annotation)[0]: model
                for model in typing.get_args(typing.get_args(Event)[0])}
DOC = (Path(__file__).resolve().parents[2] / "schemas" / "EVENTS.md").read_text()


def section(title: str) -> str:
    """The text under the heading ``title`` up to the next heading of any level."""
    match = re.search(rf"^#+ {re.escape(title)}\n(.*?)(?=^#)", DOC + "\n#", re.S | re.M)
    assert match, f"EVENTS.md has no section {title!r}"
    return match.group(1)


def table_fields(text: str) -> list[str]:
    return re.findall(r"^\| `([a-z_]+)` \|", text, re.M)


def json_examples(text: str) -> list[dict]:
    return [json.loads(block) for block in re.findall(r"```json\n(.*?)```", text, re.S)]


@pytest.mark.parametrize("event_type", EVENT_TYPES)
def test_the_envelope_table_lists_exactly_the_envelope_fields(event_type):
    model = EVENT_MODELS[event_type]
    assert sorted(table_fields(section("Envelope (every event)"))) == sorted(model.model_fields)


def test_the_harness_table_lists_exactly_its_fields():
    assert table_fields(section("`harness`")) == list(Harness.model_fields)


@pytest.mark.parametrize("event_type", EVENT_TYPES)
def test_each_payload_table_lists_exactly_the_model_fields_in_order(event_type):
    assert table_fields(section(f"`{event_type}`")) == list(PAYLOAD_MODELS[event_type].model_fields)


@pytest.mark.parametrize("event_type", EVENT_TYPES)
def test_each_payload_section_has_one_valid_example_of_its_type(event_type):
    examples = json_examples(section(f"`{event_type}`"))
    assert len(examples) == 1
    event = validate_event(examples[0])
    assert event.type == event_type
    assert set(examples[0]["payload"]) <= set(PAYLOAD_MODELS[event_type].model_fields)


def test_the_limits_and_names_match_the_code():
    assert f"`{DEFAULT_TOPIC}`" in DOC
    assert f"({MAX_EVENT_BYTES:,} bytes)" in DOC
    assert f"schema version {SCHEMA_VERSION})" in DOC
    for event_type in EVENT_TYPES:
        assert f"`{event_type}`" in section("Envelope (every event)")
