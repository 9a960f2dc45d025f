"""A real S3-compatible server on loopback for the tests: ``moto_server`` from ``moto[server]`` (its conditional
writes made atomic, as S3's are: ``tests/moto_atomic.py``).

One server per test session (it starts in ~1 s); each test gets its own bucket,
so lakes never see each other. ``S3Server.env`` holds the ``AWS_*`` settings a
user would export for such a server (endpoint, keys, region, plain HTTP), the
same variables every trajlake command reads.

>>> with S3Server() as s3:  # doctest: +SKIP
...     bucket = s3.new_bucket()
...     lake_root = f"s3://{bucket}/lake"
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

from devkit.ports import free_port


class S3Server:
    """A ``moto_server`` process on a free loopback port."""

    def __init__(self, *, check_keys: bool = False) -> None:
        """``check_keys``: moto authenticates every request against its IAM users (none: every key is wrong)."""
        self.check_keys = check_keys
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._proc: subprocess.Popen | None = None

    @property
    def env(self) -> dict[str, str]:
        """The ``AWS_*`` variables that point a client (delta-rs, DuckDB, tansu, boto3) at this server."""
        return {
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_REGION": "us-east-1",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ENDPOINT": self.endpoint,
            "AWS_ALLOW_HTTP": "true",
        }

    def start(self) -> "S3Server":
        self._proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).with_name("moto_atomic.py")), "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            env={**os.environ, **self.env, **({"INITIAL_NO_AUTH_ACTION_COUNT": "0"} if self.check_keys else {})},
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"{self.endpoint}/moto-api/", timeout=1).close()
                return self
            except OSError:
                if self._proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"moto_server did not start on port {self.port}")
                time.sleep(0.05)

    @property
    def pid(self) -> int:
        """The server's process id (to freeze it with SIGSTOP in fault tests)."""
        if self._proc is None:
            raise RuntimeError("the S3 server is not running")
        return self._proc.pid

    def new_bucket(self, name: str | None = None) -> str:
        """Create a bucket (a fresh unique one unless ``name`` is given) and return its name."""
        import boto3

        name = name or f"b-{uuid.uuid4().hex[:12]}"
        client = boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1",
                              aws_access_key_id="testing", aws_secret_access_key="testing")
        client.create_bucket(Bucket=name)
        return name

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
        self._proc = None

    def __enter__(self) -> "S3Server":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
