"""``follow``: train every new dataset version once, as it appears, and announce the checkpoint.

The loop: gather announced versions (Kafka ``dataset.version`` events, plus
a registry poll every ``poll_interval_s`` and at start), drop those that
already have a checkpoint, train the oldest remaining one, write its
``checkpoint.ready`` event, repeat until ``stop_event`` is set. With
``chain`` (the default) each version trains on top of the newest checkpoint
of the same dataset, so the policy keeps improving; the first starts from
``config.model``. The lake is the only state: a killed follower, restarted,
re-derives the same run id for the interrupted version and resumes it from
its last DeepSpeed checkpoint.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime

from schemas.control import CONTROL_TOPIC, CheckpointReadyEvent
from store.lake import Lake
from trainer.config import TrainConfig
from trainer.errors import TrainerError
from trainer.loop import StepLog, train_dataset
from trainer.records import CheckpointRecord, list_checkpoints, run_states
from trainer.versions import ControlListener, VersionKey, registry_versions

log = logging.getLogger(__name__)


def follow(
    lake: Lake,
    config: TrainConfig,
    *,
    stop_event: threading.Event,
    bootstrap_servers: str | None = None,
    control_topic: str = CONTROL_TOPIC,
    datasets: list[str] | None = None,
    poll_interval_s: float = 30.0,
    chain: bool = True,
    max_attempts: int = 5,
    on_checkpoint: Callable[[CheckpointRecord], None] | None = None,
    on_step: Callable[[StepLog], None] | None = None,
) -> list[CheckpointRecord]:
    """Train new versions of ``datasets`` (all when None) until ``stop_event``; returns what it trained.

    A version whose run was started ``max_attempts`` times without finishing (a crash loop:
    out of memory, a bad sample the checks miss) is skipped with an error log;
    ``trajlake train --dataset NAME@VERSION`` retries it by hand.
    """
    listener = _listen(bootstrap_servers, control_topic)
    publish = _publisher(bootstrap_servers, control_topic)
    pending: set[VersionKey] = set()
    given_up: set[VersionKey] = set()
    trained: list[CheckpointRecord] = []
    next_poll = 0.0
    log.info("event=follow_started datasets=%s kafka=%s", datasets or "all", bool(listener))
    try:
        while not stop_event.is_set():
            if time.monotonic() >= next_poll:
                pending |= registry_versions(lake, datasets)
                next_poll = time.monotonic() + poll_interval_s
            if listener is not None:
                pending |= listener.poll(timeout_s=1.0, datasets=datasets)
            done = {(c.dataset, c.dataset_version) for c in list_checkpoints(lake)}
            todo = sorted(pending - done - given_up)
            worn = _worn_out(lake, todo, max_attempts)
            if worn:
                log.error("event=follow_give_up versions=%s reason=started_%d_times_without_finishing",
                          sorted(worn), max_attempts)  # fmt: skip
                given_up |= worn
                continue
            if not todo:
                if listener is None:
                    stop_event.wait(min(poll_interval_s, 1.0))
                continue
            record = _train_one(lake, config, todo[0], chain=chain, on_step=on_step)
            if record is None:
                given_up.add(todo[0])
                continue
            trained.append(record)
            publish(record)
            if on_checkpoint is not None:
                on_checkpoint(record)
    finally:
        if listener is not None:
            listener.close()
    log.info("event=follow_stopped trained=%d", len(trained))
    return trained


def _worn_out(lake: Lake, todo: list[VersionKey], max_attempts: int) -> set[VersionKey]:
    """The versions in ``todo`` whose run reached ``max_attempts`` starts without finishing."""
    if not todo:
        return set()
    return {
        (s.dataset, s.dataset_version) for s in run_states(lake).values()
        if s.status != "finished" and s.attempt >= max_attempts and (s.dataset, s.dataset_version) in todo
    }  # fmt: skip


def _train_one(lake: Lake, config: TrainConfig, key: VersionKey, *, chain: bool, on_step) -> CheckpointRecord | None:
    """Train one version; a version that cannot be trained is logged and skipped (None)."""
    name, version = key
    history = list_checkpoints(lake, dataset=name) if chain else []
    parent = history[-1] if history else None
    run_config = config.model_copy(update={"model": parent.hf_path}) if parent else config
    log.info("event=follow_train dataset=%s version=%d base=%s", name, version, run_config.model)
    try:
        return train_dataset(lake, name, version, run_config,
                             parent_checkpoint_id=parent.checkpoint_id if parent else None, on_step=on_step)  # fmt: skip
    except TrainerError as exc:
        log.error("event=follow_skip dataset=%s version=%d error=%s", name, version, exc)
        return None


def _listen(bootstrap_servers: str | None, topic: str) -> ControlListener | None:
    if not bootstrap_servers:
        return None
    try:
        return ControlListener(bootstrap_servers, topic=topic)
    except Exception as exc:  # kafka-python raises many types for an unreachable broker
        log.warning("event=kafka_unavailable bootstrap=%s fallback=registry_poll error=%s", bootstrap_servers, exc)
        return None


def _publisher(bootstrap_servers: str | None, topic: str) -> Callable[[CheckpointRecord], None]:
    """A function that announces a checkpoint; failing to announce never loses the checkpoint row."""

    def publish(record: CheckpointRecord) -> None:
        if not bootstrap_servers:
            return
        event = checkpoint_ready_event(record)
        try:
            from kafka import KafkaProducer

            producer = KafkaProducer(bootstrap_servers=bootstrap_servers, request_timeout_ms=10_000)
            try:
                producer.send(topic, value=event.model_dump_json().encode(), key=record.dataset.encode()).get(timeout=30)
            finally:
                producer.close()
            log.info("event=checkpoint_ready_published checkpoint_id=%s", record.checkpoint_id)
        except Exception as exc:  # the checkpoints table is the truth; the event is a notification
            log.warning("event=checkpoint_ready_not_published checkpoint_id=%s error=%s", record.checkpoint_id, exc)

    return publish


def checkpoint_ready_event(record: CheckpointRecord) -> CheckpointReadyEvent:
    """The ``checkpoint.ready`` control event of a checkpoint row."""
    return CheckpointReadyEvent(
        event_id=str(uuid.uuid4()), ts=datetime.now(UTC), checkpoint_id=record.checkpoint_id,
        dataset=record.dataset, dataset_version=record.dataset_version, path=record.ds_path,
        hf_path=record.hf_path, metrics=record.metrics,
    )  # fmt: skip
