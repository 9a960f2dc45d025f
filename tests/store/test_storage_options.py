"""A lake built from a bare object-store URI carries the environment's credentials."""

from store.lake import Lake


def test_an_s3_lake_takes_aws_settings_from_the_environment(monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9000")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "ak")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "sk")
    lake = Lake("s3://bucket/lake")
    assert lake.storage_options["AWS_ENDPOINT_URL"] == "http://127.0.0.1:9000"
    assert lake.storage_options["aws_conditional_put"] == "etag"


def test_explicit_options_win_and_local_lakes_need_none(monkeypatch, tmp_path):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9000")
    assert Lake("s3://bucket/lake", storage_options={"AWS_REGION": "eu"}).storage_options == {"AWS_REGION": "eu"}
    assert dict(Lake(str(tmp_path)).storage_options) == {}


def test_duckdb_gets_the_same_endpoint_and_keys_as_delta_rs() -> None:
    from store.storage import duckdb_secret, storage_options

    env = {"AWS_ACCESS_KEY_ID": "ak", "AWS_SECRET_ACCESS_KEY": "s'k", "AWS_REGION": "eu-west-1",
           "AWS_ENDPOINT_URL": "http://127.0.0.1:9000", "AWS_ALLOW_HTTP": "true"}
    secret = duckdb_secret("s3://b/lake", storage_options("s3://b/lake", env))
    assert "KEY_ID 'ak'" in secret and "SECRET 's''k'" in secret and "REGION 'eu-west-1'" in secret
    assert "ENDPOINT '127.0.0.1:9000'" in secret and "USE_SSL false" in secret and "URL_STYLE 'path'" in secret
    assert "credential_chain" not in secret  # keys given: nothing asks the instance metadata address
    assert duckdb_secret("/tmp/lake", {}) is None


def test_pyarrow_filesystem_follows_the_endpoint(tmp_path) -> None:
    import pyarrow.fs as pafs

    from store.storage import arrow_filesystem

    filesystem, path = arrow_filesystem("s3://b/lake", {"AWS_ENDPOINT_URL": "http://127.0.0.1:9000",
                                                        "AWS_ACCESS_KEY_ID": "a", "AWS_SECRET_ACCESS_KEY": "s"})
    assert isinstance(filesystem, pafs.S3FileSystem) and path == "b/lake"
    settings = filesystem.__reduce__()[1][0]
    assert (settings["endpoint_override"], settings["scheme"]) == ("127.0.0.1:9000", "http")
    assert arrow_filesystem(str(tmp_path), {})[1] == str(tmp_path)


def test_a_store_problem_names_the_setting(s3_server, s3_env) -> None:
    from store.storage import storage_options, store_problem

    root = f"s3://{s3_server.new_bucket()}/lake"
    assert store_problem(root, storage_options(root)) is None
    assert "does not exist" in store_problem("s3://missing-bucket/lake", storage_options(root))
    unreachable = {**storage_options(root), "AWS_ENDPOINT_URL": "http://127.0.0.1:1", "AWS_ENDPOINT": "http://127.0.0.1:1"}
    assert "AWS_ENDPOINT_URL" in store_problem(root, unreachable)


def test_without_keys_an_s3_lake_is_refused_unless_the_credential_chain_is_asked_for(s3_server, s3_env, monkeypatch):
    import subprocess
    import sys

    import pytest

    from store.storage import CredentialsMissing, duckdb_secret

    root = f"s3://{s3_server.new_bucket()}/lake"
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "TRAJLAKE_AWS_CREDENTIAL_CHAIN"):
        monkeypatch.delenv(key, raising=False)
    with pytest.raises(CredentialsMissing, match="TRAJLAKE_AWS_CREDENTIAL_CHAIN=true"):
        Lake(root)
    run = subprocess.run([sys.executable, "-m", "trajlake.cli", "sql", "SELECT 1", "--lake", root],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert run.stderr.count("\n") == 1 and "AWS_ACCESS_KEY_ID" in run.stderr and "CREDENTIAL_CHAIN" in run.stderr
    # asked for: allowed through to the engines' credential chain (not called here: it would ask the
    # instance metadata address, as delta-rs's object_store does without keys, whatever AWS_EC2_METADATA_DISABLED says)
    monkeypatch.setenv("TRAJLAKE_AWS_CREDENTIAL_CHAIN", "true")
    lake = Lake(root)
    assert "AWS_ACCESS_KEY_ID" not in lake.storage_options
    assert "PROVIDER credential_chain" in duckdb_secret(root, lake.storage_options)


def test_keys_the_object_store_refuses_are_one_line_naming_them() -> None:
    import os
    import subprocess
    import sys

    from tests.object_store import S3Server

    with S3Server(check_keys=True) as strict:  # knows no IAM user: the keys in strict.env are wrong
        root = "s3://lake-bucket/lake"
        env = {**{k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "TRAJLAKE_"))}, **strict.env,
               "COLUMNS": "400"}
        run = subprocess.run([sys.executable, "-m", "trajlake.cli", "sql", "SELECT 1", "--lake", root], env=env,
                             capture_output=True, text=True, timeout=120)
    assert run.returncode == 1 and "Traceback" not in run.stderr
    assert run.stderr.count("\n") == 1 and "refused the credentials" in run.stderr and "AWS_ACCESS_KEY_ID" in run.stderr
