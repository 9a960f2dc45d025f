"""``trajlake gateway``: refuses to start without keys, with a message that says what to set."""

from __future__ import annotations

from typer.testing import CliRunner

from trajlake.cli import build_app


def test_gateway_without_keys_exits_2_and_says_what_to_set(monkeypatch, tmp_path):
    for name in ("TRAJLAKE_GATEWAY_KEYS", "TRAJLAKE_GATEWAY_KEYS_FILE", "TRAJLAKE_ALLOW_ANONYMOUS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TRAJLAKE_SPOOL_DIR", str(tmp_path / "spool"))
    result = CliRunner().invoke(build_app(), ["gateway", "--port", "1"])
    assert result.exit_code == 2
    assert "TRAJLAKE_GATEWAY_KEYS" in result.output


def test_gateway_with_a_missing_keys_file_exits_2(monkeypatch, tmp_path):
    monkeypatch.delenv("TRAJLAKE_GATEWAY_KEYS", raising=False)
    monkeypatch.setenv("TRAJLAKE_SPOOL_DIR", str(tmp_path / "spool"))
    result = CliRunner().invoke(build_app(), ["gateway", "--keys-file", str(tmp_path / "nope")])
    assert result.exit_code == 2 and "cannot read keys file" in result.output


def test_gateway_with_a_bad_upstream_url_exits_2(monkeypatch, tmp_path):
    monkeypatch.setenv("TRAJLAKE_GATEWAY_KEYS", "k=t")
    monkeypatch.setenv("TRAJLAKE_SPOOL_DIR", str(tmp_path / "spool"))
    result = CliRunner().invoke(build_app(), ["gateway", "--upstream", "localhost:8000"])
    assert result.exit_code == 2 and "must be http(s)" in result.output
