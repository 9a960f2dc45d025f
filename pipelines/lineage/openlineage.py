"""OpenLineage run events for Marquez, DataHub and other lineage servers.

Runs: dataset builds (``build-dataset.<name>``; inputs: the source tables at
the Delta versions the build pinned; output: ``datasets/<name>`` at its new
version), training runs (``train.<dataset>``, ``trainer.train_lineage``; input:
the dataset version; output: the checkpoint) and scheduled jobs
(``scheduler.<job>``, the parent of the builds and trainings it starts). Each
run sends START, then COMPLETE or FAIL (with the error), through the
``openlineage-python`` client's transports: ``http`` (a Marquez-compatible
``/api/v1/lineage``), ``file`` (one JSON event per line) or ``console`` (a
log line at INFO per event, shown at any log level);
``none`` sends nothing. The client is imported only when lineage is on
(``pipelines.lineage.client_events``).

Dataset ids follow the OpenLineage naming spec: a local lake is namespace
``file`` with the absolute path as name; ``s3://bucket/prefix`` is namespace
``s3://bucket`` with ``prefix/<table>`` as name. Lineage never fails the work
it describes: a transport error is logged and the run goes on.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlparse

from pipelines.datasets.build import BuildResult, build_dataset
from pipelines.datasets.config import BuildConfig
from schemas.tables import dataset_table
from store.lake import Lake
from schemas.errors import SettingsInvalid

log = logging.getLogger(__name__)

PRODUCER = "https://github.com/trajlake/trajlake"
TRANSPORTS = ("none", "http", "file", "console")
CONSOLE_LOGGER = "openlineage.client.transport.console"
"""Where the client's ``console`` transport writes each event (one JSON line at INFO)."""


class LineageConfig(Protocol):
    """What lineage needs from a process's settings (``trajlake.settings.CommonSettings`` has it)."""

    openlineage_transport: str
    openlineage_url: str | None
    openlineage_endpoint: str
    openlineage_api_key: str | None
    openlineage_file: str | None
    openlineage_namespace: str


class LineageConfigError(SettingsInvalid):
    """Transport settings that cannot work; says which setting to fix."""


@dataclass(frozen=True)
class LineageDataset:
    """A dataset of a run: (namespace, name) per the naming spec, and its version (a Delta version, a checkpoint id)."""

    namespace: str
    name: str
    version: str | None = None


def dataset_id(uri: str) -> tuple[str, str]:
    """(namespace, name) of a table or folder per the OpenLineage naming spec.

    >>> dataset_id("s3://lake-bucket/prod/events")
    ('s3://lake-bucket', 'prod/events')
    >>> dataset_id("/data/lake/events")
    ('file', '/data/lake/events')
    """
    parsed = urlparse(uri)
    if parsed.scheme and parsed.scheme != "file" and parsed.netloc:
        return f"{parsed.scheme}://{parsed.netloc}", parsed.path.strip("/")
    path = parsed.path if parsed.scheme == "file" else uri
    return "file", str(Path(path).resolve())


def uri_dataset(uri: str, version: object | None) -> LineageDataset:
    """The table or folder at ``uri`` at ``version``."""
    return LineageDataset(*dataset_id(uri), version=None if version is None else str(version))


def lake_dataset(lake_root: str, table: str, version: int | None) -> LineageDataset:
    """A lake table (``datasets/NAME`` style names nest) at a Delta version."""
    return uri_dataset(f"{lake_root.rstrip('/')}/{table}", version)


def build_datasets(manifest: Mapping[str, Any], *, lake_root: str) -> tuple[list[LineageDataset], list[LineageDataset]]:
    """Inputs (source tables at the pinned versions) and output (the dataset version) of a build."""
    inputs = [lake_dataset(lake_root, t, v) for t, v in sorted(manifest["sources"].items())]
    return inputs, [lake_dataset(lake_root, dataset_table(manifest["dataset"]), manifest["version"])]


def build_job(dataset: str) -> str:
    return f"build-dataset.{dataset}"


@dataclass
class RunScope:
    """One run in progress: set ``inputs``/``outputs`` as they become known; they go out with COMPLETE."""

    job: str
    run_id: str
    inputs: list[LineageDataset] = field(default_factory=list)
    outputs: list[LineageDataset] = field(default_factory=list)
    parent: tuple[str, str] | None = None
    """(run id, job name) of the run that started this one."""
    window: tuple[str, str] | None = None
    """Nominal start and end (RFC 3339) of a scheduled run."""
    error: str | None = None


def run_event(manifest: dict[str, Any], *, namespace: str) -> dict[str, Any]:
    """The COMPLETE RunEvent (as JSON) of the build that made ``manifest``'s version; ``namespace`` is the
    lake root. The run id derives from (dataset, version, content hash): the same version, the same event.

    >>> run_event(get_manifest(lake, "nightly", 3), namespace=lake.root)["eventType"]  # doctest: +SKIP
    'COMPLETE'
    """
    from pipelines.lineage import client_events as _lineage_events

    run_id = uuid.uuid5(uuid.NAMESPACE_URL, f"trajlake:{manifest['dataset']}@{manifest['version']}:"
                                            f"{manifest['content_hash']}")
    inputs, outputs = build_datasets(manifest, lake_root=namespace)
    scope = RunScope(job=build_job(manifest["dataset"]), run_id=str(run_id), inputs=inputs, outputs=outputs)
    event = _lineage_events.run_event(scope, "COMPLETE", event_time=manifest["built_at"], namespace="trajlake",
                                      producer=PRODUCER)
    return _lineage_events.as_json(event)


_ACTIVE: ContextVar[tuple[Lineage, RunScope | None] | None] = ContextVar("trajlake_openlineage", default=None)
"""The lineage of the work in progress and its innermost run: runs started inside it become children."""


class Lineage:
    """Sends run events through one OpenLineage client (``None``: lineage off, every call a no-op)."""

    def __init__(self, client: Any | None, *, namespace: str = "trajlake") -> None:
        self.client = client
        """An ``openlineage.client.OpenLineageClient``, or None."""
        self.namespace = namespace

    @contextmanager
    def active(self) -> Iterator[Lineage]:
        """Make this the lineage of ``traced_run`` calls inside (``traced_build``, ``trainer.train_lineage``)."""
        token = _ACTIVE.set((self, None))
        try:
            yield self
        finally:
            _ACTIVE.reset(token)

    @contextmanager
    def run(self, job: str, *, window: tuple[datetime, datetime] | None = None) -> Iterator[RunScope]:
        """START now, then COMPLETE (with the scope's datasets) or FAIL (with the error, re-raised).
        A run started inside another (same context) is its child (``ParentRunFacet``).

        >>> with lineage.run("train.nightly") as run:  # doctest: +SKIP
        ...     run.outputs.append(uri_dataset("/ckpt/ck-1/hf", "ck-1"))
        """
        scope = RunScope(job=job, run_id=str(uuid.uuid4()))
        active = _ACTIVE.get()
        if active is not None and active[0] is self and active[1] is not None:
            scope.parent = (active[1].run_id, active[1].job)
        if window is not None:
            scope.window = (_time(window[0]), _time(window[1]))
        self._emit(scope, "START")
        token = _ACTIVE.set((self, scope))
        try:
            yield scope
        except BaseException as exc:
            scope.error = f"{type(exc).__name__}: {exc}"
            self._emit(scope, "FAIL")
            raise
        finally:
            _ACTIVE.reset(token)
        self._emit(scope, "COMPLETE")

    def scheduled(self, job: str, run: Callable[[Any], Mapping[str, Any] | None]) -> Callable[[Any], Any]:
        """A scheduler job's ``run(window)`` as the run ``scheduler.<job>`` (nominal time: the window);
        the builds and trainings it starts are its children."""

        def traced(window: Any) -> Mapping[str, Any] | None:
            with self.run(f"scheduler.{job}", window=(window.start, window.end)):
                return run(window)

        return traced

    def _emit(self, scope: RunScope, state: str) -> None:
        if self.client is None:
            return
        from pipelines.lineage import client_events as _lineage_events

        event = _lineage_events.run_event(scope, state, event_time=_time(datetime.now(timezone.utc)),
                                          namespace=self.namespace, producer=PRODUCER)
        try:
            self.client.emit(event)
        except Exception as exc:  # noqa: BLE001 - any transport failure: lineage never fails the run it describes
            log.warning("openlineage.emit_failed job=%s state=%s error=%r", scope.job, state, str(exc))


@contextmanager
def traced_run(job: str) -> Iterator[RunScope | None]:
    """A run of the active lineage (``Lineage.active`` or an enclosing run); None, and nothing sent, without one."""
    active = _ACTIVE.get()
    if active is None:
        yield None
        return
    with active[0].run(job) as scope:
        yield scope


def traced_build(lake: Lake, name: str, config: BuildConfig, **options: Any) -> BuildResult:
    """``build_dataset`` as the run ``build-dataset.<name>`` of the active lineage (a plain build without one)."""
    with traced_run(build_job(name)) as scope:
        result = build_dataset(lake, name, config, **options)
        if scope is not None:
            scope.inputs, scope.outputs = build_datasets(result.manifest, lake_root=lake.root)
    return result


def open_lineage(config: LineageConfig) -> Lineage:
    """The ``Lineage`` the settings ask for; raises ``LineageConfigError`` for an unusable combination."""
    transport = config.openlineage_transport.lower()
    if transport not in TRANSPORTS:
        raise LineageConfigError(f"TRAJLAKE_OPENLINEAGE_TRANSPORT={transport!r}: use one of {', '.join(TRANSPORTS)}")
    if transport == "none":
        return Lineage(None, namespace=config.openlineage_namespace)
    spec: dict[str, Any] = {"type": transport}
    if transport == "http":
        if not config.openlineage_url:
            raise LineageConfigError("the http transport needs TRAJLAKE_OPENLINEAGE_URL (e.g. http://marquez:5000)")
        # The client's default retries (5, backoff 0.3 s) hold a run ~9 s per event while the server is down.
        spec |= {"url": config.openlineage_url, "endpoint": config.openlineage_endpoint, "timeout": 5.0,
                 "retry": {"total": 2, "read": 2, "connect": 2, "backoff_factor": 0.2,
                           "status_forcelist": [500, 502, 503, 504], "allowed_methods": ["HEAD", "POST"]}}
        if config.openlineage_api_key:
            spec["auth"] = {"type": "api_key", "apiKey": config.openlineage_api_key}
    elif transport == "file":
        if not config.openlineage_file:
            raise LineageConfigError("the file transport needs TRAJLAKE_OPENLINEAGE_FILE (a path)")
        spec |= {"log_file_path": config.openlineage_file, "append": True}
    else:  # console: the client logs each event at INFO, and library loggers sit at WARNING unless --debug
        logging.getLogger(CONSOLE_LOGGER).setLevel(logging.INFO)
    from pipelines.lineage import client_events as _lineage_events

    return Lineage(_lineage_events.client(spec), namespace=config.openlineage_namespace)


def _time(moment: datetime) -> str:
    return moment.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")
