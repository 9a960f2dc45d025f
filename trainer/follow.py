"""``follow``: train every new dataset version once, as it appears, and announce the checkpoint.

The lake is the truth; Kafka only wakes the follower up. On every poll
(every ``poll_interval_s``, and at once when a ``dataset.version`` event
about this lake arrives) it reads the registry and trains, oldest first,
every version newer than the newest trained version of its dataset that has
no checkpoint and did not fail (``train_runs`` failed: refused at validation
or raised; ``trajlake train --retry NAME@V`` asks for it again, whatever its
age). A version that failed before its run was recorded (the lake or the base
model briefly unreachable) is no such record: it is tried again at the next
poll, and a chain waits for it. Events about other lakes sharing the broker
(another ``lake_id``) are ignored. Several followers share the work: a
version is trained under a lease (``trainer.leases``), so a version another
follower holds is skipped this poll, and one whose holder died is taken over
and resumed from its last restart point. With ``chain`` (the default) each
version trains on top of the newest checkpoint of the same dataset, so only
the oldest untrained version of a dataset is eligible; the first starts from
``config.model``.

Inside an active lineage (``pipelines.lineage.openlineage``, as ``trajlake train
--follow`` sets up), each version it trains is an OpenLineage run
``train.<dataset>`` (``trainer.train_lineage``): START, then COMPLETE with the
dataset version as input and the checkpoint as output, or FAIL with the error.
A version another follower holds is skipped before any run starts.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from schemas.control import CONTROL_TOPIC, CheckpointReadyEvent
from store.identity import lake_id
from store.lake import Lake
from trainer.config import TrainConfig
from trainer.leases import LeaseLost, VersionHeld
from trainer.leases import history as lease_history
from trainer.loop import DEFAULT_LEASE, StepLog
from trainer.records import CheckpointRecord, list_checkpoints, run_states, version_states
from trainer.train_lineage import traced_train
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
    lease: timedelta = DEFAULT_LEASE,
    on_checkpoint: Callable[[CheckpointRecord], None] | None = None,
    on_step: Callable[[StepLog], None] | None = None,
) -> list[CheckpointRecord]:
    """Train new versions of ``datasets`` (all when None) until ``stop_event``; returns what it trained.

    A version whose run was started ``max_attempts`` times without finishing (a crash loop:
    out of memory, a bad sample the checks miss) is skipped with an error log;
    ``trajlake train --dataset NAME@VERSION`` retries it by hand.
    """
    me = lake_id(lake)
    listener = _listen(bootstrap_servers, control_topic, me)
    publish = _publisher(bootstrap_servers, control_topic, me)
    warned: set[VersionKey] = set()
    trained: list[CheckpointRecord] = []
    next_poll = 0.0
    log.info("event=follow_started lake_id=%s datasets=%s kafka=%s", me, datasets or "all", bool(listener))
    try:
        while not stop_event.is_set():
            if time.monotonic() >= next_poll:
                next_poll = time.monotonic() + poll_interval_s
                try:
                    todo = pending_versions(lake, datasets, chain=chain, max_attempts=max_attempts, warned=warned)
                except Exception as exc:  # the lake is briefly unreachable: try again at the next poll
                    log.warning("event=follow_poll_failed error=%s: %s", type(exc).__name__, exc)
                    continue
                for key in todo:
                    if stop_event.is_set():
                        break
                    record = _train_one(lake, config, key, chain=chain, lease=lease, on_step=on_step)
                    if record is not None:
                        trained.append(record)
                        publish(record)
                        if on_checkpoint is not None:
                            on_checkpoint(record)
                        next_poll = 0.0  # the next version of a chain may be eligible now
                        break
                continue
            if listener is None:
                stop_event.wait(min(poll_interval_s, 1.0))
            elif listener.poll(timeout_s=1.0, datasets=datasets):
                next_poll = 0.0
    finally:
        if listener is not None:
            listener.close()
    log.info("event=follow_stopped trained=%d", len(trained))
    return trained


def pending_versions(lake: Lake, datasets: list[str] | None, *, chain: bool = True, max_attempts: int = 5,
                     warned: set[VersionKey] | None = None) -> list[VersionKey]:  # fmt: skip
    """The versions a follower should train now, oldest first (see the module docstring)."""
    done = {(c.dataset, c.dataset_version) for c in list_checkpoints(lake)}
    newest: dict[str, int] = {}
    for name, version in done:
        newest[name] = max(version, newest.get(name, -1))
    states = version_states(lake)
    refused = {k for k, s in states.items() if s.status == "failed"}
    retried = {k for k, s in states.items() if s.status == "retry"}  # asked for again: whatever its age
    worn = {(s.dataset, s.dataset_version) for s in run_states(lake).values()
            if s.status == "started" and s.attempt >= max_attempts}  # fmt: skip
    todo: list[VersionKey] = []
    for key in sorted(registry_versions(lake, datasets)):
        if key in done or key in refused or (key[1] <= newest.get(key[0], -1) and key not in retried):
            continue
        if chain and any(k[0] == key[0] for k in todo):
            continue  # a chain trains its oldest version first
        if key in worn:
            if warned is not None and key not in warned:
                log.error("event=follow_give_up version=%s@%d reason=started_%d_times_without_finishing",
                          key[0], key[1], max_attempts)  # fmt: skip
                warned.add(key)
            continue
        todo.append(key)
    return todo


def _train_one(lake: Lake, config: TrainConfig, key: VersionKey, *, chain: bool, lease: timedelta,
               on_step) -> CheckpointRecord | None:  # fmt: skip
    """Train one version; None when another process holds it or it failed (logged; recorded once its run began)."""
    name, version = key
    # the newest checkpoint of an older version: every follower derives the same parent, hence the same run id,
    # also when another one finished this very version a moment ago (its run is then found finished, not redone)
    history = [c for c in list_checkpoints(lake, dataset=name) if c.dataset_version < version] if chain else []
    parent = history[-1] if history else None
    run_config = config.model_copy(update={"model": parent.hf_path}) if parent else config
    began = datetime.now(UTC)
    claims = lease_history(lake, name, version)
    if claims and claims[-1].held(began):  # checked before a lineage run starts; the claim decides again
        log.info("event=follow_skip_held dataset=%s version=%d reason=held by %s", name, version, claims[-1].owner)
        return None
    log.info("event=follow_train dataset=%s version=%d base=%s", name, version, run_config.model)
    try:
        record = traced_train(lake, name, version, run_config, lease=lease, on_step=on_step,
                              parent_checkpoint_id=parent.checkpoint_id if parent else None)  # fmt: skip
        return record if record.created_at >= began else None  # else another follower just finished it
    except (VersionHeld, LeaseLost) as exc:
        log.info("event=follow_skip_held dataset=%s version=%d reason=%s", name, version, exc)
    except Exception as exc:  # recorded failed in train_runs: left until `train --retry`; unrecorded: the next poll
        log.error("event=follow_failed dataset=%s version=%d error=%s: %s", name, version, type(exc).__name__, exc)
    return None


def _listen(bootstrap_servers: str | None, topic: str, me: str) -> ControlListener | None:
    if not bootstrap_servers:
        return None
    try:
        return ControlListener(bootstrap_servers, topic=topic, lake_id=me)
    except Exception as exc:  # kafka-python raises many types for an unreachable broker
        log.warning("event=kafka_unavailable bootstrap=%s fallback=registry_poll error=%s", bootstrap_servers, exc)
        return None


def _publisher(bootstrap_servers: str | None, topic: str, me: str) -> Callable[[CheckpointRecord], None]:
    """A function that announces a checkpoint; failing to announce never loses the checkpoint row."""

    def publish(record: CheckpointRecord) -> None:
        if not bootstrap_servers:
            return
        event = checkpoint_ready_event(record, lake_id=me)
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


def checkpoint_ready_event(record: CheckpointRecord, *, lake_id: str | None = None) -> CheckpointReadyEvent:
    """The ``checkpoint.ready`` control event of a checkpoint row in lake ``lake_id``."""
    return CheckpointReadyEvent(
        lake_id=lake_id,
        event_id=str(uuid.uuid4()), ts=datetime.now(UTC), checkpoint_id=record.checkpoint_id,
        dataset=record.dataset, dataset_version=record.dataset_version, path=record.ds_path,
        hf_path=record.hf_path, metrics=record.metrics,
    )  # fmt: skip
