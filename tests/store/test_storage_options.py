"""A lake built from a bare object-store URI carries the environment's credentials."""

from store.lake import Lake


def test_an_s3_lake_takes_aws_settings_from_the_environment(monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9000")
    lake = Lake("s3://bucket/lake")
    assert lake.storage_options["AWS_ENDPOINT_URL"] == "http://127.0.0.1:9000"
    assert lake.storage_options["aws_conditional_put"] == "etag"


def test_explicit_options_win_and_local_lakes_need_none(monkeypatch, tmp_path):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9000")
    assert Lake("s3://bucket/lake", storage_options={"AWS_REGION": "eu"}).storage_options == {"AWS_REGION": "eu"}
    assert dict(Lake(str(tmp_path)).storage_options) == {}
