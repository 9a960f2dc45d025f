"""The Kafka side of the ingester: a consumer with auto-commit off, and its assignment.

Built on confluent-kafka (librdkafka), as the gateway's producer is: measured
here, consuming a ~4.2 KB workload event cost 5.2 us of CPU against 35-47 us
with kafka-python (15 vs 110 us for ~17 KB events), whose fetcher decodes every
record in Python.

Offsets live in the Delta log, never in Kafka. With a consumer group the
rebalance callbacks do no I/O: they take the partitions paused (librdkafka
would otherwise start fetching from Kafka's committed offsets) and raise a
flag; the loop then re-reads the Delta markers and ``seek``s, which assigns the
partitions at those offsets and resumes them. The consumer never moves its own
position: ``auto.offset.reset=error`` turns an out-of-range fetch into
``OutOfRange``, which the loop handles (``ingest.log_check``), where "earliest"
would jump silently past or back over data; librdkafka stops fetching such a
partition, so ``refetch`` restarts it where it was. In static mode
(``partitions=[0, 1]``) the consumer assigns itself the partitions at the
offsets ``seek`` gives, without joining a group: the right mode for kill tests
and for pinning work by hand.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, NamedTuple

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition

from schemas.errors import BrokerUnreachable, Unreachable

log = logging.getLogger(__name__)

FETCH_MAX_WAIT_MS = 2_000
"""How long the broker may work on a fetch. tansu on ``s3://`` answers only what it read from the object
store within this wait and starts over on the next fetch: at 100 ms it never served a record of a 300-batch
partition in 40 s, at 500 ms 4.7 records/s, at 2,000 ms 70/s (same machine). A broker holding the records
answers at once whatever the wait (tansu ``memory://``: 11-17 ms median either way)."""
OUT_OF_RANGE_ERRORS = (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE)
UNREADABLE_BATCH_ERRORS = (KafkaError._BAD_COMPRESSION, KafkaError._BAD_MSG, KafkaError.UNSUPPORTED_COMPRESSION_TYPE)
"""A record batch librdkafka cannot read (damaged bytes, a codec it lacks): it retries the same batch for ever, so the
partition's later records wait; nothing reaches the ingester to quarantine."""
UNREADABLE_WARN_EVERY_S = 60.0


class Record(NamedTuple):
    """One Kafka message, as the batch reads it."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None


class OutOfRange(Exception):
    """The broker said the positions of ``partitions`` are outside its log; nothing was reset."""

    def __init__(self, partitions: Sequence[int]) -> None:
        self.partitions = sorted(partitions)
        super().__init__(f"fetch out of range on partitions {self.partitions}")


class AssignmentFlag:
    """Set when partitions were revoked or assigned; the loop reacts after poll returns."""

    def __init__(self) -> None:
        self._changed = threading.Event()

    def raise_(self) -> None:
        self._changed.set()

    def take(self) -> bool:
        """True once per change."""
        changed = self._changed.is_set()
        self._changed.clear()
        return changed


class IngestConsumer:
    """One topic's consumer: polls ``Record``s, positions only where it is told (``seek``)."""

    def __init__(self, client: Consumer, topic: str, *, settings: Mapping[str, Any],
                 partitions: Sequence[int] | None, flag: AssignmentFlag) -> None:
        self.topic, self.config, self.flag = topic, dict(settings), flag
        self.static = partitions is not None
        self._client = client
        self._partitions: list[int] = sorted(partitions) if partitions is not None else []
        self._next: dict[int, int] = {}
        """Per partition, the offset the next record should have (-2: the log's beginning)."""
        self._pending: OutOfRange | None = None
        self._unreadable_warned: dict[int, float] = {}
        """Per partition, when an unreadable batch was last warned about (``time.monotonic``)."""

    def _on_assign(self, client: Consumer, assigned: list[TopicPartition]) -> None:
        """A rebalance gave these partitions: take them paused, from nowhere in particular, and raise the flag."""
        for tp in assigned:
            tp.offset = OFFSET_BEGINNING
        client.assign(assigned)
        client.pause(assigned)
        self._partitions = sorted(tp.partition for tp in assigned if tp.topic == self.topic)
        self.flag.raise_()

    def _on_revoke(self, client: Consumer, revoked: list[TopicPartition]) -> None:
        self._partitions = []
        self.flag.raise_()

    def partitions(self) -> list[int]:
        """The topic's partitions this consumer owns now."""
        return list(self._partitions)

    def heard_from_broker(self) -> bool:
        """Whether a fetch answer came back for every owned partition (librdkafka's cached watermarks; no I/O).
        librdkafka fetches in its own threads, so an empty poll before that says nothing about the topic."""
        return all(self._client.get_watermark_offsets(TopicPartition(self.topic, p), cached=True)[1] >= 0
                   for p in self._partitions)

    def poll(self, *, timeout_ms: int, max_records: int) -> list[Record]:
        """Up to ``max_records`` records (waits up to ``timeout_ms`` for that many); raises ``OutOfRange`` for
        partitions the broker refused, after the records that came with the refusal were returned."""
        if self._pending is not None:
            pending, self._pending = self._pending, None
            raise pending
        topic, out, refused = self.topic, [], set()
        for m in self._client.consume(max_records, timeout_ms / 1000):
            err = m.error()
            if err is None:
                out.append(Record(topic, m.partition(), m.offset(), m.key(), m.value()))
            elif err.code() in OUT_OF_RANGE_ERRORS:
                refused.add(m.partition())
            elif err.fatal():  # librdkafka gives up on this client (it retries everything else itself)
                raise Unreachable(f"the Kafka consumer of {topic!r} failed for good: {err.str()}",
                                  hint="restart the ingester: it resumes from the lake's markers")
            elif err.code() in UNREADABLE_BATCH_ERRORS:
                self._warn_unreadable(m.partition(), m.offset(), err)
            else:  # transport errors, a broker restarting: librdkafka retries on its own
                log.debug("consumer error=%s", err)
        nexts = self._next
        for r in out:
            nexts[r.partition] = r.offset + 1
        if refused:
            self._pending = OutOfRange(sorted(refused))
        return out

    def _warn_unreadable(self, partition: int, offset: int | None, err: KafkaError) -> None:
        """A warning per partition at most every ``UNREADABLE_WARN_EVERY_S`` (librdkafka reports it every fetch)."""
        now = time.monotonic()
        if now - self._unreadable_warned.get(partition, -UNREADABLE_WARN_EVERY_S) < UNREADABLE_WARN_EVERY_S:
            return
        self._unreadable_warned[partition] = now
        log.warning("partition %s: the record batch at offset %s cannot be read (%s): this partition's later records "
                    "wait behind it; repair or remove that batch on the broker", partition, offset, err.str())

    def seek(self, resume: Mapping[int, int | None]) -> None:
        """Position each partition where the Delta log says (None: from the beginning) and fetch from there."""
        self._next = {p: OFFSET_BEGINNING if o is None else o for p, o in resume.items()}
        self._pending = None
        self._fetch_from_next()

    def refetch(self, partitions: Sequence[int]) -> None:
        """After ``OutOfRange`` (librdkafka stops fetching those partitions): fetch again from where they were."""
        if any(p in self._next for p in partitions):
            self._fetch_from_next()

    def _fetch_from_next(self) -> None:
        tps = [TopicPartition(self.topic, p, o) for p, o in sorted(self._next.items()) if p in self._partitions]
        self._client.assign(tps)
        if not self.static and tps:
            self._client.resume(tps)

    def report_progress(self, last_offsets: Mapping[int, int]) -> None:
        """Commit offsets to the group for monitoring (lag dashboards) only; never read back as truth."""
        if self.static or not last_offsets:
            return
        try:
            self._client.commit(offsets=[TopicPartition(self.topic, p, o + 1) for p, o in last_offsets.items()],
                                asynchronous=True)
        except KafkaException as exc:  # a rebalance in flight; the Delta log already has the truth
            log.debug("kafka offset commit skipped error=%s", exc)

    def close(self) -> None:
        try:
            self._client.close()
        except (KafkaException, RuntimeError) as exc:  # closing a consumer of a broker that went away
            log.debug("consumer close error=%s", exc)


class _ClientLog:
    """librdkafka's own lines (about 20 per failed bootstrap, one per lost connection) at DEBUG: what matters
    reaches the ingester as an exception or an error it handles, and a failed bootstrap is one
    ``BrokerUnreachable`` line."""

    _log = logging.getLogger("ingest.consumer.librdkafka")

    def log(self, level: int, msg: str, *args: object) -> None:
        self._log.debug(msg, *args)


DEBUG_CONTEXTS = "cgrp,fetch"
"""librdkafka's debug contexts at TRAJLAKE_LOG_LEVEL=DEBUG: group joins, assignments, revokes, session timeouts
and fetches, of which it logs nothing otherwise (how the soak told a member dropped from its group from one that
polled nothing)."""


def new_client(settings: Mapping[str, Any]) -> Consumer:
    """A librdkafka consumer whose own log lines go to the ``ingest.consumer.librdkafka`` logger, at DEBUG (then
    with ``DEBUG_CONTEXTS`` on)."""
    if _ClientLog._log.isEnabledFor(logging.DEBUG):
        settings = {"debug": DEBUG_CONTEXTS, **settings}
    return Consumer(dict(settings), logger=_ClientLog())


def client_settings(bootstrap_servers: str, group: str, **extra: Any) -> dict[str, Any]:
    """librdkafka settings every consumer of the topic shares: no auto-commit, no silent position reset."""
    return {
        "bootstrap.servers": bootstrap_servers,
        "group.id": group,  # librdkafka wants one even without a group join; static mode never joins
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "error",
        "fetch.wait.max.ms": FETCH_MAX_WAIT_MS,
        "log.connection.close": False,
        **extra,
    }


def open_consumer(
    bootstrap_servers: str,
    topic: str,
    *,
    group: str | None,
    partitions: Sequence[int] | None,
    flag: AssignmentFlag,
    session_timeout_ms: int = 6000,
    heartbeat_interval_ms: int = 2000,
    max_partition_fetch_bytes: int = 8 * 1024 * 1024,
    bootstrap_timeout_ms: int = 30_000,
) -> IngestConsumer:
    """A consumer subscribed with ``group`` or, when ``partitions`` is given, statically assigned (on ``seek``)."""
    settings = client_settings(
        bootstrap_servers, group or "trajlake-static",
        **{"session.timeout.ms": session_timeout_ms, "heartbeat.interval.ms": heartbeat_interval_ms,
           "partition.assignment.strategy": "range",  # eager: a rebalance revokes all, then assigns
           "max.partition.fetch.bytes": max_partition_fetch_bytes, "fetch.max.bytes": 64 * 1024 * 1024,
           "queued.max.messages.kbytes": 64 * 1024},  # prefetched messages held in librdkafka, at most
    )
    client = new_client(settings)
    try:
        client.list_topics(topic, timeout=bootstrap_timeout_ms / 1000)
    except KafkaException:
        client.close()
        raise BrokerUnreachable(bootstrap_servers) from None
    consumer = IngestConsumer(client, topic, settings=settings, partitions=partitions, flag=flag)
    if partitions is not None:
        flag.raise_()
    else:
        client.subscribe([topic], on_assign=consumer._on_assign, on_revoke=consumer._on_revoke)
    return consumer


@contextmanager
def quiet_client_logs() -> Iterator[None]:
    """Keep kafka-python's own connection warnings (about 20 lines per failed bootstrap) off the terminal:
    a failed bootstrap becomes one ``BrokerUnreachable`` line. They stay visible at DEBUG."""
    client = logging.getLogger("kafka")
    if client.isEnabledFor(logging.DEBUG):
        yield
        return
    level = client.level
    client.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        client.setLevel(level)
