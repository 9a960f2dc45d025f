"""Events of every accepted schema version still read.

Version 1 is the only version so far, so the upgrade chain is exercised with
a hypothetical version 2 registered inside the tests (monkeypatched
SCHEMA_VERSION and UPGRADES), not with a history invented in the code.
"""

from __future__ import annotations

import copy
import json

import pytest

import schemas.versions as versions
from schemas.errors import InvalidEvent
from schemas.versions import decode_event, upgrade

V1_REWARD = {
    "event_id": "e-1", "type": "reward", "schema_version": 1, "ts": "2026-01-01T00:00:00Z",
    "task_id": "t-1", "rollout_id": "r-1", "seq": 0,
    "payload": {"name": "correctness", "value": 0.5},
}


def test_today_version_1_is_current_and_reads():
    assert versions.SCHEMA_VERSION == 1 and versions.MIN_SCHEMA_VERSION == 1
    assert decode_event(json.dumps(V1_REWARD)).payload.value == 0.5


@pytest.fixture
def version_2(monkeypatch):
    """A hypothetical version 2 whose upgrade from 1 fills a reward's ``source``."""
    calls = []

    def one_to_two(raw: dict) -> dict:
        calls.append(raw["event_id"])
        if raw["type"] == "reward":
            raw["payload"] = {**raw["payload"], "source": raw["payload"].get("source") or "upgraded-from-v1"}
        return raw

    monkeypatch.setattr(versions, "SCHEMA_VERSION", 2)
    monkeypatch.setitem(versions.UPGRADES, 1, one_to_two)
    return calls


def test_an_older_event_is_upgraded_through_the_chain(version_2):
    event = decode_event(json.dumps(V1_REWARD))
    assert event.schema_version == 2
    assert event.payload.source == "upgraded-from-v1"
    assert version_2 == ["e-1"]


def test_a_current_event_is_not_upgraded(version_2):
    event = decode_event(json.dumps({**V1_REWARD, "schema_version": 2}))
    assert event.payload.source is None and version_2 == []


def test_the_upgrade_works_on_a_copy(version_2):
    raw = copy.deepcopy(V1_REWARD)
    upgraded = upgrade(raw)
    assert raw == V1_REWARD
    assert upgraded["schema_version"] == 2 and upgraded["payload"]["source"] == "upgraded-from-v1"


def test_a_newer_event_than_the_reader_is_refused(version_2):
    with pytest.raises(InvalidEvent, match="3 is newer than this reader \\(2\\): upgrade trajlake"):
        decode_event(json.dumps({**V1_REWARD, "schema_version": 3}))


def test_a_gap_in_the_chain_is_reported_not_crashed_on(monkeypatch):
    monkeypatch.setattr(versions, "SCHEMA_VERSION", 3)
    monkeypatch.setitem(versions.UPGRADES, 1, lambda raw: raw)
    with pytest.raises(InvalidEvent, match="no upgrade from version 2") as exc:
        decode_event(json.dumps(V1_REWARD))
    assert exc.value.field == "schema_version"


def test_every_version_ever_accepted_has_an_upgrade():
    for version in range(versions.MIN_SCHEMA_VERSION, versions.SCHEMA_VERSION):
        assert version in versions.UPGRADES
