"""OpenLineage run events for Marquez, DataHub and other lineage servers.

Runs: dataset builds (``build-dataset.<name>``; inputs: the source tables at
the Delta versions the build pinned; output: ``datasets/<name>`` at its new
version), training runs (``train.<dataset>``; input: the dataset version;
output: the checkpoint) and scheduled jobs (``scheduler.<job>``, the parent
of the build and training runs it starts). Each run sends START, then
COMPLETE or FAIL (with the error), through the ``openlineage-python``
client's transports: ``http`` (a Marquez-compatible ``/api/v1/lineage``),
``file`` (one JSON event per line) or ``console``; ``none`` sends nothing.

Dataset ids follow the OpenLineage naming spec: a local lake is namespace
``file`` with the absolute path as name; ``s3://bucket/prefix`` is namespace
``s3://bucket`` with ``prefix/<table>`` as name. Lineage is never allowed to
fail the work it describes: a transport error is logged and the run goes on.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlparse

from openlineage.client import OpenLineageClient
from openlineage.client.event_v2 import InputDataset, Job, OutputDataset, Run, RunEvent, RunState
from openlineage.client.generated.dataset_version_dataset import DatasetVersionDatasetFacet
from openlineage.client.generated.error_message_run import ErrorMessageRunFacet
from openlineage.client.generated.nominal_time_run import NominalTimeRunFacet
from openlineage.client.generated.parent_run import Job as ParentJob
from openlineage.client.generated.parent_run import ParentRunFacet
from openlineage.client.generated.parent_run import Run as ParentRun
from openlineage.client.serde import Serde
from openlineage.client.transport import get_default_factory

from pipelines.build import BuildResult, build_dataset
from pipelines.config import BuildConfig
from store.lake import Lake

log = logging.getLogger(__name__)
_ACTIVE: ContextVar[tuple[Lineage, RunScope | None] | None] = ContextVar("trajlake_openlineage", default=None)
"""The lineage of the work in progress and its innermost run: runs started inside it become children."""

PRODUCER = "https://github.com/trajlake/trajlake"
TRANSPORTS = ("none", "http", "file", "console")


class LineageConfig(Protocol):
    """What lineage needs from a process's settings (``trajlake.settings.CommonSettings`` has it)."""

    openlineage_transport: str
    openlineage_url: str | None
    openlineage_endpoint: str
    openlineage_api_key: str | None
    openlineage_file: str | None
    openlineage_namespace: str


class LineageConfigError(ValueError):
    """Transport settings that cannot work; says which setting to fix."""


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


def table_dataset(lake_root: str, table: str, version: int | None, *, output: bool = False
                  ) -> InputDataset | OutputDataset:
    """A lake table at a Delta version, as an input (or output) dataset."""
    namespace, name = dataset_id(f"{lake_root.rstrip('/')}/{table}")
    facets = {"version": DatasetVersionDatasetFacet(datasetVersion=str(version))} if version is not None else {}
    cls = OutputDataset if output else InputDataset
    return cls(namespace=namespace, name=name, facets=facets)


def build_datasets(manifest: Mapping[str, Any], *, lake_root: str) -> tuple[list[InputDataset], list[OutputDataset]]:
    """Inputs (source tables at the pinned versions) and output (the dataset version) of a build."""
    inputs = [table_dataset(lake_root, t, v) for t, v in sorted(manifest["sources"].items())]
    output = table_dataset(lake_root, f"datasets/{manifest['dataset']}", manifest["version"], output=True)
    return inputs, [output]


def run_event(manifest: dict[str, Any], *, namespace: str) -> dict[str, Any]:
    """The COMPLETE RunEvent (as JSON) of the build that made ``manifest``'s version; ``namespace`` is the
    lake root. The run id derives from (dataset, version, content hash): the same version, the same event.

    >>> run_event(get_manifest(lake, "nightly", 3), namespace=lake.root)["eventType"]  # doctest: +SKIP
    'COMPLETE'
    """
    inputs, outputs = build_datasets(manifest, lake_root=namespace)
    event = RunEvent(
        eventType=RunState.COMPLETE, eventTime=manifest["built_at"], producer=PRODUCER,
        run=Run(runId=str(build_run_id(manifest))), job=Job(namespace="trajlake", name=build_job(manifest["dataset"])),
        inputs=inputs, outputs=outputs,
    )
    return Serde.to_dict(event)


def build_run_id(manifest: Mapping[str, Any]) -> uuid.UUID:
    return uuid.uuid5(uuid.NAMESPACE_URL, f"trajlake:{manifest['dataset']}@{manifest['version']}:"
                                          f"{manifest['content_hash']}")


def build_job(dataset: str) -> str:
    return f"build-dataset.{dataset}"


@dataclass
class RunScope:
    """One run in progress: set ``inputs``/``outputs`` as they become known; they go out with COMPLETE."""

    job: str
    run_id: str
    inputs: list[InputDataset] = field(default_factory=list)
    outputs: list[OutputDataset] = field(default_factory=list)
    facets: dict[str, Any] = field(default_factory=dict)

    def parent_facet(self, namespace: str) -> ParentRunFacet:
        """The facet that makes another run this one's child."""
        return ParentRunFacet(run=ParentRun(runId=self.run_id), job=ParentJob(namespace=namespace, name=self.job))


class Lineage:
    """Sends run events through one OpenLineage client (``None``: lineage off, every call a no-op)."""

    def __init__(self, client: OpenLineageClient | None, *, namespace: str = "trajlake") -> None:
        self.client = client
        self.namespace = namespace

    @property
    def enabled(self) -> bool:
        return self.client is not None

    @contextmanager
    def active(self) -> Iterator[Lineage]:
        """Make this the lineage of ``traced_run`` calls inside (``traced_build``, ``trainer.train_lineage``)."""
        token = _ACTIVE.set((self, None))
        try:
            yield self
        finally:
            _ACTIVE.reset(token)

    @contextmanager
    def run(self, job: str, *, inputs: Sequence[InputDataset] = (),
            window: tuple[datetime, datetime] | None = None) -> Iterator[RunScope]:
        """START now, then COMPLETE (with the scope's datasets) or FAIL (with the error, re-raised).
        A run started inside another (same context) is its child (``ParentRunFacet``).

        >>> with lineage.run("train.nightly") as run:  # doctest: +SKIP
        ...     run.outputs.append(table_dataset(root, "checkpoints/ck-1", None, output=True))
        """
        scope = RunScope(job=job, run_id=str(uuid.uuid4()), inputs=list(inputs))
        active = _ACTIVE.get()
        parent = active[1] if active is not None and active[0] is self else None
        if parent is not None:
            scope.facets["parent"] = parent.parent_facet(self.namespace)
        if window is not None:
            scope.facets["nominalTime"] = NominalTimeRunFacet(nominalStartTime=_time(window[0]),
                                                             nominalEndTime=_time(window[1]))
        self._emit(scope, RunState.START)
        token = _ACTIVE.set((self, scope))
        try:
            yield scope
        except BaseException as exc:
            scope.facets["errorMessage"] = ErrorMessageRunFacet(message=f"{type(exc).__name__}: {exc}",
                                                               programmingLanguage="python")
            self._emit(scope, RunState.FAIL)
            raise
        finally:
            _ACTIVE.reset(token)
        self._emit(scope, RunState.COMPLETE)

    def scheduled(self, job: str, run: Callable[[Any], Mapping[str, Any] | None]) -> Callable[[Any], Any]:
        """A scheduler job's ``run(window)`` as the run ``scheduler.<job>`` (nominal time: the window);
        the builds and trainings it starts are its children."""

        def traced(window: Any) -> Mapping[str, Any] | None:
            with self.run(f"scheduler.{job}", window=(window.start, window.end)):
                return run(window)

        return traced

    def _emit(self, scope: RunScope, state: RunState) -> None:
        if self.client is None:
            return
        event = RunEvent(
            eventType=state, eventTime=_time(datetime.now(timezone.utc)), producer=PRODUCER,
            run=Run(runId=scope.run_id, facets=dict(scope.facets)), job=Job(namespace=self.namespace, name=scope.job),
            inputs=list(scope.inputs), outputs=list(scope.outputs),
        )
        try:
            self.client.emit(event)
        except Exception as exc:  # noqa: BLE001 - any transport failure: lineage never fails the run it describes
            log.warning("openlineage.emit_failed job=%s state=%s error=%r", scope.job, state.value, str(exc))

    def close(self) -> None:
        if self.client is not None:
            self.client.close(timeout=5)


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
        spec |= {"url": config.openlineage_url, "endpoint": config.openlineage_endpoint}
        if config.openlineage_api_key:
            spec["auth"] = {"type": "api_key", "apiKey": config.openlineage_api_key}
    elif transport == "file":
        if not config.openlineage_file:
            raise LineageConfigError("the file transport needs TRAJLAKE_OPENLINEAGE_FILE (a path)")
        spec |= {"log_file_path": config.openlineage_file, "append": True}
    client = OpenLineageClient(transport=get_default_factory().create(spec))
    return Lineage(client, namespace=config.openlineage_namespace)


def _time(moment: datetime) -> str:
    return moment.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")
