"""schemas/event.schema.json: up to date with the models, and it agrees with them on EVENTS.md's examples."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator

from schemas.json_schema import SCHEMA_PATH, event_json_schema, render
from schemas.versions import validate_event

DOC = (Path(__file__).resolve().parents[2] / "schemas" / "EVENTS.md").read_text()
EXAMPLES = [json.loads(block) for block in re.findall(r"```json\n(.*?)```", DOC, re.S)]
VALIDATOR = Draft202012Validator(json.loads(SCHEMA_PATH.read_text()))


def test_the_committed_schema_is_generated_from_the_models():
    assert SCHEMA_PATH.read_text() == render(), "schemas/event.schema.json is stale: run python -m schemas.json_schema"
    Draft202012Validator.check_schema(event_json_schema())


def test_every_example_of_events_md_is_valid():
    assert len(EXAMPLES) >= 7
    for example in EXAMPLES:
        validate_event(example)  # the models accept it ...
        assert list(VALIDATOR.iter_errors(example)) == [], example["type"]  # ... and so does the schema


def _broken(mutate) -> list[dict]:
    out = []
    for example in EXAMPLES:
        event = copy.deepcopy(example)
        mutate(event)
        out.append(event)
    return out


@pytest.mark.parametrize("mutate", [
    lambda e: e.pop("event_id"),
    lambda e: e.update(type="llm.unknown"),
    lambda e: e.update(seq="7"),
    lambda e: e.update(attempt=-1),
    lambda e: e.update(payload=[]),
    lambda e: e.update(harness={"name": "h"}),
], ids=["no event_id", "unknown type", "seq as string", "negative attempt", "payload not object", "harness half"])
def test_the_schema_refuses_what_the_models_refuse(mutate):
    for event in _broken(mutate):
        assert not VALIDATOR.is_valid(event), event
        with pytest.raises(ValueError):
            validate_event(event)


def test_payload_types_are_checked_per_event_type():
    request = next(e for e in EXAMPLES if e["type"] == "llm.request")
    bad = copy.deepcopy(request)
    bad["payload"]["prompt_token_ids"] = [1, "2"]
    assert not VALIDATOR.is_valid(bad)
    reward = copy.deepcopy(next(e for e in EXAMPLES if e["type"] == "reward"))
    reward["payload"]["value"] = "0.5"
    assert not VALIDATOR.is_valid(reward)
