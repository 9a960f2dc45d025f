"""``trajlake health``: the container health probe reads the real lake and the real broker."""

from __future__ import annotations

import pyarrow as pa
from deltalake import write_deltalake
from typer.testing import CliRunner

from trajlake.cli import build_app


def health(*args: str):
    return CliRunner().invoke(build_app(), ["health", *args], env={"COLUMNS": "300"})


def test_an_empty_s3_lake_is_healthy_and_a_missing_bucket_is_not(s3_lake, s3_server):
    write_deltalake(s3_lake.uri("events_like"), pa.table({"x": [1]}), storage_options=dict(s3_lake.storage_options))
    result = health("--lake", s3_lake.root)
    assert result.exit_code == 0 and "(1 tables)" in result.output, result.output
    result = health("--lake", "s3://no-such-bucket-x/lake")
    assert result.exit_code == 1 and "bucket 'no-such-bucket-x' does not exist" in result.output


def test_an_unreachable_object_store_names_the_settings(s3_env, monkeypatch):
    from devkit.ports import free_port

    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    result = health("--lake", "s3://bucket/lake")
    assert result.exit_code == 1 and "AWS_ENDPOINT_URL" in result.output and "Traceback" not in result.output


def test_broker_check_needs_the_topic(broker, topic, tmp_path):
    ok = health("--lake", str(tmp_path), "--broker", "--bootstrap-servers", broker.bootstrap_servers, "--topic", topic)
    assert ok.exit_code == 0 and f"topic {topic} (4 partitions)" in ok.output, ok.output
    missing = health("--lake", str(tmp_path), "--broker", "--bootstrap-servers", broker.bootstrap_servers,
                     "--topic", "no-such-topic")
    assert missing.exit_code == 1 and "topic no-such-topic does not exist" in missing.output


def test_broker_down_is_unhealthy(tmp_path):
    from devkit.ports import free_port

    result = health("--lake", str(tmp_path), "--broker", "--bootstrap-servers", f"127.0.0.1:{free_port()}")
    assert result.exit_code == 1 and "does not answer" in result.output


def test_a_missing_local_lake_or_a_file_is_unhealthy_and_an_empty_folder_is_healthy(tmp_path):
    (tmp_path / "a-file").write_text("not a lake")
    (tmp_path / "empty").mkdir()
    for root in (tmp_path / "no-such-lake", tmp_path / "a-file", f"file://{tmp_path / 'no-such-lake'}"):
        result = health("--lake", str(root))
        assert result.exit_code == 1 and "unhealthy" in result.output and "not a folder" in result.output, result.output
    result = health("--lake", str(tmp_path / "empty"))
    assert result.exit_code == 0 and "(0 tables)" in result.output, result.output
