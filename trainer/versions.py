"""Where the follower learns about dataset versions: Kafka first, the lake as fallback.

``registry_versions`` reads the pipelines' ``dataset_versions`` registry when
it exists (a version is official once its registry row is there) and
otherwise every Delta version of each ``datasets/NAME`` table (one commit per
build). ``ControlListener`` reads ``dataset.version`` events about one lake from the
control topic (events of other lakes sharing the broker carry another
``lake_id`` and are ignored); they are hints to poll the registry now. It
holds no consumer-group offsets because what was trained lives in the
``checkpoints`` table, not in Kafka.
"""

from __future__ import annotations

import logging
from pathlib import Path

from pydantic import ValidationError

from ingest.broker_probe import probe_broker
from pipelines.datasets.registry import list_versions
from schemas.control import CONTROL_ADAPTER, CONTROL_TOPIC, DatasetVersionEvent
from schemas.table_names import DATASET_VERSIONS_TABLE, DATASETS_FOLDER, dataset_table
from store.lake import Lake

log = logging.getLogger(__name__)

VersionKey = tuple[str, int]


def registry_versions(lake: Lake, datasets: list[str] | None = None) -> set[VersionKey]:
    """Every known (dataset, version), from the registry or else from the Delta logs."""
    if lake.exists(DATASET_VERSIONS_TABLE):
        table = list_versions(lake)
        found = set(zip(table["dataset"].to_pylist(), table["version"].to_pylist(), strict=True))
    else:
        found = set()
        for name in _dataset_names(lake):
            latest = lake.version(dataset_table(name))
            found |= {(name, v) for v in range(latest + 1)} if latest is not None else set()
    return {k for k in found if datasets is None or k[0] in datasets}


def _dataset_names(lake: Lake) -> list[str]:
    if not lake.is_local:
        log.warning("event=registry_missing lake=%s hint=without dataset_versions only local lakes are listed", lake.root)
        return []
    folder = Path(lake.root.removeprefix("file://")) / DATASETS_FOLDER
    return sorted(p.name for p in folder.iterdir() if p.is_dir()) if folder.is_dir() else []


class ControlListener:
    """Reads ``dataset.version`` events about lake ``lake_id`` (and those without one) from the control topic."""

    def __init__(self, bootstrap_servers: str, *, topic: str = CONTROL_TOPIC, lake_id: str | None = None) -> None:
        from kafka import KafkaConsumer, TopicPartition

        from ingest.topics import ensure_topic

        probe_broker(bootstrap_servers, timeout_s=2.0)  # fail fast, not after kafka-python's retries
        ensure_topic(bootstrap_servers, topic, partitions=1)
        self._consumer = KafkaConsumer(
            bootstrap_servers=bootstrap_servers, group_id=None, enable_auto_commit=False,
            auto_offset_reset="earliest", request_timeout_ms=10_000,
        )  # fmt: skip
        parts = self._consumer.partitions_for_topic(topic) or {0}
        self._consumer.assign([TopicPartition(topic, p) for p in sorted(parts)])
        self.topic = topic
        self.lake_id = lake_id

    def poll(self, *, timeout_s: float, datasets: list[str] | None = None) -> set[VersionKey]:
        """Versions announced since the last call (waits up to ``timeout_s`` for the first)."""
        found: set[VersionKey] = set()
        batches = self._consumer.poll(timeout_ms=int(timeout_s * 1000))
        for records in batches.values():
            for record in records:
                try:
                    event = CONTROL_ADAPTER.validate_json(record.value)
                except ValidationError as exc:
                    log.warning("event=bad_control_event offset=%d error=%s", record.offset, str(exc)[:200])
                    continue
                if not isinstance(event, DatasetVersionEvent) or (datasets is not None and event.dataset not in datasets):
                    continue
                if self.lake_id is not None and event.lake_id not in (None, self.lake_id):
                    log.debug("event=control_hint_other_lake dataset=%s version=%d lake_id=%s",
                              event.dataset, event.version, event.lake_id)  # fmt: skip
                    continue
                found.add((event.dataset, event.version))
        return found

    def close(self) -> None:
        self._consumer.close()
