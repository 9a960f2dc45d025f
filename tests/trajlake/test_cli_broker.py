"""``trajlake broker``: a log kept on s3:// survives SIGKILL, its tansu child dies with it, clean stops exit 0."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from devkit.ports import free_port, port_is_free

TOPIC = "trajlake.events"


def start_broker(port: int, *flags: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-m", "trajlake.cli", "broker", "--port", str(port), "--partitions", "2", *flags],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ, **(env or {})},
    )
    for line in proc.stdout:
        if "broker ready" in line:
            return proc
    raise AssertionError(f"broker did not start (rc={proc.wait()})")


def wait_until_free(port: int, timeout_s: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not port_is_free(port):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def read_all(bootstrap: str, expected: int) -> dict[tuple[int, int], bytes]:
    """(partition, offset) -> value of the first ``expected`` records (end offsets lie on tansu: count records)."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, consumer_timeout_ms=10_000)
    consumer.assign([TopicPartition(TOPIC, p) for p in (0, 1)])
    consumer.seek_to_beginning()
    seen = {}
    for message in consumer:
        seen[(message.partition, message.offset)] = message.value
        if len(seen) == expected:
            break
    consumer.close()
    return seen


def test_s3_log_survives_sigkill_and_the_child_dies_with_the_wrapper(s3_server, s3_env):
    bucket = s3_server.new_bucket()
    port = free_port()
    flags = ("--storage", f"s3://{bucket}/", "--cluster-id", f"c-{uuid.uuid4().hex[:8]}")
    proc = start_broker(port, *flags)
    try:
        producer = KafkaProducer(bootstrap_servers=f"127.0.0.1:{port}", acks="all")
        sent = {}
        for i in range(60):
            meta = producer.send(TOPIC, key=f"r{i % 7}".encode(), value=f"m{i}".encode()).get(timeout=30)
            sent[(meta.partition, meta.offset)] = f"m{i}".encode()
        producer.close()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert wait_until_free(port), "tansu outlived the killed `trajlake broker` and still holds the port"

    proc = start_broker(port, *flags)
    try:
        assert read_all(f"127.0.0.1:{port}", len(sent)) == sent
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    assert wait_until_free(port)


def test_default_memory_broker_says_so_and_stops_cleanly_on_sigterm():
    port = free_port()
    proc = start_broker(port)
    proc.send_signal(signal.SIGTERM)
    out = proc.stdout.read()
    assert proc.wait(timeout=60) == 0, out
    assert "broker stopped" in out
    assert wait_until_free(port)


def test_help_says_the_default_keeps_everything_in_memory():
    out = subprocess.run([sys.executable, "-m", "trajlake.cli", "broker", "--help"], capture_output=True, text=True,
                         env={**os.environ, "COLUMNS": "200"}).stdout
    assert "keeps everything in memory" in out and "s3://BUCKET/" in out and "Exit codes" in out


@pytest.mark.parametrize("storage, expected", [
    ("s3://no-such-bucket-here/", "bucket 'no-such-bucket-here' does not exist"),
    ("sqlite://x.db", "use memory://"),
])
def test_unusable_storage_is_refused_with_the_setting_named(s3_env, storage, expected):
    proc = subprocess.run([sys.executable, "-m", "trajlake.cli", "broker", "--port", str(free_port()),
                           "--storage", storage], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "COLUMNS": "300"})
    assert proc.returncode == 1
    assert expected in proc.stderr and "Traceback" not in proc.stderr


def test_port_in_use_exits_1_without_a_traceback():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        proc = subprocess.run([sys.executable, "-m", "trajlake.cli", "broker", "--port", str(port)],
                              capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "already in use" in proc.stderr and "Traceback" not in proc.stderr
