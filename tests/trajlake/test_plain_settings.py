"""``trajlake.plain_settings`` reads what ``SqlSettings`` reads, or hands the environment to it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from schemas.errors import SettingsInvalid
from trajlake.plain_settings import FREE_TEXT, PARSED, PlainSqlSettings, plain_sql_settings
from trajlake.settings import SqlSettings, load


def test_the_plain_reader_knows_every_field_of_sql_settings():
    """A field added to ``SqlSettings`` (or ``CommonSettings``) must be taught to the plain reader: as free text only
    when any text is a valid value."""
    assert FREE_TEXT | PARSED == set(SqlSettings.model_fields)
    for name in FREE_TEXT:
        assert SqlSettings.model_fields[name].annotation in (str, str | None, Path), name


ENVS = [
    {},
    {"TRAJLAKE_LAKE": "/lakes/a"},
    {"trajlake_lake": "/lakes/b", "TRAJLAKE_SQL_MAX_ROWS": "7"},
    {"TRAJLAKE_SQL_MAX_ROWS": "007", "TRAJLAKE_LOG_LEVEL": "debug", "TRAJLAKE_TOPIC": "t"},
    {"TRAJLAKE_LAKE": "s3://bucket/lake", "AWS_REGION": "eu-west-1", "AWS_ACCESS_KEY_ID": "k"},
    {"TRAJLAKE_LAKE": "", "TRAJLAKE_OPENLINEAGE_URL": "", "TRAJLAKE_HOME": "~/x", "TRAJLAKE_NOT_A_FIELD": "{"},
]


@pytest.mark.parametrize("env", ENVS)
@pytest.mark.parametrize("flag", [None, "/from/flag"])
def test_plain_values_are_the_settings_values(env, flag, monkeypatch):
    for key in [k for k in os.environ if k.lower().startswith(("trajlake_", "aws_", "azure_", "google_"))]:
        monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    plain, settings = plain_sql_settings(lake=flag), load(SqlSettings, lake=flag)
    assert plain == PlainSqlSettings(settings.lake, settings.sql_max_rows, settings.object_store)


@pytest.mark.parametrize("env", [
    {"TRAJLAKE_SQL_MAX_ROWS": "many"},
    {"TRAJLAKE_SQL_MAX_ROWS": "-1"},
    {"TRAJLAKE_SQL_MAX_ROWS": " 5"},
    {"TRAJLAKE_LOG_LEVEL": "loud"},
    {"TRAJLAKE_OBJECT_STORE": "{}"},
    {"TRAJLAKE_LAKE": "/a", "trajlake_lake": "/b"},
])
def test_a_value_only_sql_settings_can_judge_goes_to_it(env, monkeypatch):
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert plain_sql_settings() is None
    try:  # what the command then does: SqlSettings' value, or its words for a bad one
        load(SqlSettings)
    except SettingsInvalid as exc:
        assert "TRAJLAKE_" in str(exc)
