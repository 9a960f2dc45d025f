"""Settings: each option declared once (package model + the environment), read once, bad values named."""

from __future__ import annotations

import pytest

from api.config import QueryApiConfig
from ingest.gateway.config import GatewayConfig
from ingest.ingester import IngesterConfig
from schemas.errors import SettingsInvalid
from store.storage import CredentialsMissing
from trajlake.commands.gateway import GatewaySettings
from trajlake.commands.ingest import IngestSettings
from trajlake.commands.query_api import QueryApiSettings
from trajlake.settings import CommonSettings, ShellSettings, load


def test_a_commands_settings_are_its_packages_options(monkeypatch):
    monkeypatch.setenv("TRAJLAKE_BATCH_MAX_EVENTS", "7")
    settings = load(IngestSettings, lake="/tmp/lake", group=None)
    assert isinstance(settings, IngesterConfig) and settings.batch_max_events == 7
    assert settings.group == IngesterConfig.model_fields["group"].default  # a flag not given leaves the default
    assert issubclass(GatewaySettings, GatewayConfig) and issubclass(QueryApiSettings, QueryApiConfig)


def test_a_bad_value_names_its_variable(monkeypatch):
    monkeypatch.setenv("TRAJLAKE_BATCH_MAX_MS", "soon")
    with pytest.raises(SettingsInvalid, match="TRAJLAKE_BATCH_MAX_MS") as caught:
        load(IngestSettings)
    assert caught.value.exit_code == 2
    monkeypatch.setenv("TRAJLAKE_LOG_LEVEL", "loud")
    with pytest.raises(SettingsInvalid, match="TRAJLAKE_LOG_LEVEL.*'loud'"):
        load(ShellSettings)


def test_the_object_store_variables_are_read_once_into_the_lake(monkeypatch):
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "TRAJLAKE_AWS_CREDENTIAL_CHAIN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_REGION", "eu-west-1")
    settings = load(CommonSettings, lake="s3://bucket/lake")
    with pytest.raises(CredentialsMissing):
        settings.open_lake()
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "a")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s")
    with pytest.raises(CredentialsMissing):  # read once: these settings were built before the keys were set
        settings.open_lake()
    lake = load(CommonSettings, lake="s3://bucket/lake").open_lake()
    assert lake.storage_options["AWS_REGION"] == "eu-west-1" and lake.storage_options["AWS_ACCESS_KEY_ID"] == "a"
    assert load(CommonSettings, lake="/tmp/local-lake").open_lake().storage_options == {}
