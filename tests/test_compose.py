"""docker-compose.yml and Dockerfile: valid structure, real commands, configuration keys the code reads.

No Docker engine runs here: Debian's ``docker-compose config`` validates the
file (CI installs it; elsewhere the test skips), and the structure is checked
by hand either way.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
import typer
import yaml
from pydantic_settings import BaseSettings

from schemas.errors import SettingsInvalid
import trajlake.commands
from trajlake.cli import build_app

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES: dict = COMPOSE["services"]
TRAJLAKE_SERVICES = {name: s for name, s in SERVICES.items() if s.get("image", "").startswith("trajlake")}
READ_BY_OS_ENVIRON = {"TRAJLAKE_LOG_LEVEL", "TRAJLAKE_HOME"}


def cli_commands() -> dict:
    """Name -> click command of every registered ``trajlake`` command."""
    return typer.main.get_command(build_app()).every_command()


def settings_keys() -> set[str]:
    """Every TRAJLAKE_* variable a settings class of the CLI reads."""
    for info in pkgutil.iter_modules(trajlake.commands.__path__):
        module = importlib.import_module(f"trajlake.commands.{info.name}")
        for name, builder in vars(module).items():
            if name.endswith("_settings") and callable(builder) and builder.__module__ == module.__name__:
                builder()  # settings classes built on first use (the ingester's), so that start-up stays light
    keys = set()
    pending = list(BaseSettings.__subclasses__())
    while pending:
        cls = pending.pop()
        pending.extend(cls.__subclasses__())
        prefix = cls.model_config.get("env_prefix", "")
        if prefix.startswith("TRAJLAKE_"):
            keys |= {f"{prefix}{name}".upper() for name in cls.model_fields}
    return keys


def compose_client() -> list[str] | None:
    """Debian's ``docker-compose`` (validates without a Docker engine), else the ``docker compose`` plugin."""
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "compose", "version"], capture_output=True).returncode == 0:
        return [docker, "compose"]
    return None


def test_docker_compose_config_accepts_the_file() -> None:
    client = compose_client()
    if client is None:
        if os.environ.get("CI"):
            pytest.fail("CI must validate docker-compose.yml: .ci/run installs Debian's docker-compose")
        pytest.skip("no docker-compose here (apt-get install docker-compose); CI runs this check")
    result = subprocess.run([*client, "-f", str(ROOT / "docker-compose.yml"), "config", "--quiet"],
                            capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stderr


def test_stack_has_every_service_of_the_design() -> None:
    assert {"kafka", "kafka-init", "minio", "minio-init", "gateway", "gateway-lb", "ingester", "scheduler", "query-api",
            "trainer"} <= set(SERVICES)
    for name, service in SERVICES.items():
        assert "image" in service or "build" in service, name
        assert set(service) <= COMPOSE_SERVICE_KEYS, (name, set(service) - COMPOSE_SERVICE_KEYS)


COMPOSE_SERVICE_KEYS = {
    "image", "build", "command", "entrypoint", "environment", "depends_on", "ports", "volumes", "deploy",
    "profiles", "healthcheck", "restart", "stop_grace_period",
}


def test_kafka_is_a_single_kraft_node_without_zookeeper() -> None:
    env = SERVICES["kafka"]["environment"]
    assert SERVICES["kafka"]["image"].startswith("apache/kafka:")
    assert set(env["KAFKA_PROCESS_ROLES"].split(",")) == {"broker", "controller"}
    assert env["KAFKA_CONTROLLER_QUORUM_VOTERS"] == f"{env['KAFKA_NODE_ID']}@kafka:9093"
    assert not any("ZOOKEEPER" in key for key in env)
    assert "kafka:9092" in env["KAFKA_ADVERTISED_LISTENERS"]


def test_dependencies_exist_and_wait_for_topics_and_bucket() -> None:
    for name, service in SERVICES.items():
        for dependency, condition in (service.get("depends_on") or {}).items():
            assert dependency in SERVICES, (name, dependency)
            assert condition["condition"] in {"service_started", "service_healthy", "service_completed_successfully"}
    for name in ("gateway", "ingester", "scheduler", "query-api", "trainer"):
        assert SERVICES[name]["depends_on"]["kafka-init"]["condition"] == "service_completed_successfully"
        assert SERVICES[name]["depends_on"]["minio-init"]["condition"] == "service_completed_successfully"
    assert "mc mb --ignore-existing lake/trajlake" in SERVICES["minio-init"]["command"][0]
    assert SERVICES["gateway"]["depends_on"]["model"]["condition"] == "service_healthy"
    assert SERVICES["gateway-lb"]["depends_on"]["gateway"]["condition"] == "service_healthy"


LONG_RUNNING = sorted(name for name, s in SERVICES.items() if s.get("restart") != "no")


@pytest.mark.parametrize("service", LONG_RUNNING)
def test_every_long_running_service_has_a_health_check(service: str) -> None:
    check = SERVICES[service]["healthcheck"]
    assert check["test"][0] in {"CMD", "CMD-SHELL"} and check["retries"] >= 3, service
    if check["test"][1] == "trajlake":  # a real command with real flags
        commands = cli_commands()
        name, flags = check["test"][2], [a for a in check["test"][3:] if a.startswith("--")]
        assert name in commands
        assert set(flags) <= {o for p in commands[name].params for o in getattr(p, "opts", [])}


def test_probes_match_what_each_service_serves() -> None:
    probe = {name: " ".join(SERVICES[name]["healthcheck"]["test"]) for name in LONG_RUNNING}
    assert "/readyz" in probe["gateway"] and "/healthz" in probe["query-api"] and "/v1/models" in probe["model"]
    assert probe["ingester"].endswith("trajlake health --broker")  # a lake read and the topic
    assert probe["scheduler"].endswith("trajlake health") and probe["trainer"].endswith("trajlake health")


def test_gateways_scale_behind_one_port_with_a_spool_each() -> None:
    gateway, lb = SERVICES["gateway"], SERVICES["gateway-lb"]
    assert gateway["deploy"]["replicas"] >= 2 and "ports" not in gateway  # no fixed host port to fight over
    spool = gateway["environment"]["TRAJLAKE_SPOOL_DIR"]
    assert gateway["volumes"] == [spool]  # an anonymous volume: one per replica, never shared
    assert lb["ports"] == ["8080:8080"]
    [mount] = lb["volumes"]
    conf = (ROOT / mount.split(":")[0]).read_text()
    assert "resolver 127.0.0.11" in conf and "set $gateway http://gateway:8080;" in conf
    assert "proxy_buffering off;" in conf and "proxy_read_timeout 600s;" in conf


def test_lake_lives_in_the_minio_bucket_with_safe_concurrent_commits() -> None:
    for name, service in TRAJLAKE_SERVICES.items():
        env = service["environment"]
        assert env["TRAJLAKE_LAKE"].startswith("s3://trajlake/"), name
        assert env["AWS_ENDPOINT_URL"] == "http://minio:9000" and env["AWS_CONDITIONAL_PUT"] == "etag", name
        assert env["TRAJLAKE_BOOTSTRAP_SERVERS"] == "kafka:9092", name


def test_ingesters_scale_and_trainer_is_a_gpu_profile() -> None:
    assert SERVICES["ingester"]["deploy"]["replicas"] >= 2
    trainer = SERVICES["trainer"]
    assert trainer["profiles"] == ["gpu"]
    [device] = trainer["deploy"]["resources"]["reservations"]["devices"]
    assert device["capabilities"] == ["gpu"] and device["driver"] == "nvidia"
    assert "cu" in trainer["build"]["args"]["TORCH_INDEX"]


@pytest.mark.parametrize("service", sorted(TRAJLAKE_SERVICES))
def test_service_runs_a_real_trajlake_command_with_real_flags(service: str) -> None:
    command = TRAJLAKE_SERVICES[service]["command"]
    commands = cli_commands()
    assert command[0] in commands, f"docker-compose {service}: no `trajlake {command[0]}` command"
    known = {opt for param in commands[command[0]].params for opt in getattr(param, "opts", [])}
    flags = [arg for arg in command[1:] if arg.startswith("--")]
    assert set(flags) <= known, (service, set(flags) - known)


def test_every_trajlake_key_in_compose_is_read_by_the_code() -> None:
    keys = settings_keys() | READ_BY_OS_ENVIRON
    used = {key for service in TRAJLAKE_SERVICES.values() for key in service["environment"] if key.startswith("TRAJLAKE_")}
    assert used - keys == set()
    assert {"TRAJLAKE_LAKE", "TRAJLAKE_SCHEDULER_CRON", "TRAJLAKE_TRAIN_OUT"} <= used


def test_ports_and_volumes_are_declared_once() -> None:
    host_ports = [p.split(":")[0] for s in SERVICES.values() for p in s.get("ports", [])]
    assert len(host_ports) == len(set(host_ports))
    named = {v.split(":")[0] for s in SERVICES.values() for v in s.get("volumes", []) if not v.startswith((".", "/"))}
    assert named <= set(COMPOSE["volumes"])


def test_dockerfile_installs_the_pinned_cpu_torch_then_the_project() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    pinned = next(d for d in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
                  if d.startswith("torch=="))
    assert re.search(r"^FROM python:3\.11-slim$", dockerfile, re.M)
    assert "ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu" in dockerfile
    assert f'pip install --index-url "${{TORCH_INDEX}}" {pinned}' in dockerfile
    assert dockerfile.index(pinned) < dockerfile.index("RUN pip install .")
    assert 'ENTRYPOINT ["trajlake"]' in dockerfile
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {".git", ".venv", "lake"} <= set(ignored)


def test_storage_options_come_from_the_environment_for_object_store_lakes() -> None:
    from store.lake import Lake, list_tables
    from store.storage import storage_options

    env = {"AWS_ENDPOINT_URL": "http://minio:9000", "AWS_ALLOW_HTTP": "true", "HOME": "/root", "TRAJLAKE_LAKE": "x",
           "AWS_ACCESS_KEY_ID": "a", "AWS_SECRET_ACCESS_KEY": "s"}
    assert storage_options("./lake", env) == {}
    assert storage_options("s3://trajlake/lake", env) == {
        "AWS_ENDPOINT_URL": "http://minio:9000", "AWS_ALLOW_HTTP": "true", "AWS_ACCESS_KEY_ID": "a",
        "AWS_SECRET_ACCESS_KEY": "s", "aws_conditional_put": "etag"}
    locked = storage_options("s3://b/l", {"AWS_S3_LOCKING_PROVIDER": "dynamodb", "TRAJLAKE_AWS_CREDENTIAL_CHAIN": "1"})
    assert "aws_conditional_put" not in locked
    with pytest.raises(SettingsInvalid, match="a lake is a folder or s3://bucket/prefix"):  # no reader has a filesystem for it
        storage_options("az://c/l", {"AZURE_STORAGE_ACCOUNT_NAME": "a"})
    assert list_tables(Lake(str(ROOT / "no-such-lake"))) == []
