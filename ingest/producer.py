"""Send wire events to Kafka: validated at the source, keyed by rollout_id.

``EventProducer`` wraps kafka-python's ``KafkaProducer`` with the settings the
contract needs: ``acks=all``, batching (``linger_ms``/``batch_size``), message
key = ``rollout_id`` (UTF-8, so a rollout stays in order on one partition) and
value = compact JSON of the event. Every event is validated before it leaves
the process, so a bad event fails here with ``InvalidEvent`` naming the field,
not hours later in the ingester's quarantine.

The idempotent producer stays off (tansu rejects ``InitProducerId``); the
ingester dedupes by ``event_id`` instead, so a resend is harmless.

>>> with EventProducer("127.0.0.1:9092") as producer:  # doctest: +SKIP
...     producer.send(event_dict)
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from typing import Any

from kafka import KafkaProducer
from kafka.codec import has_gzip, has_lz4, has_snappy, has_zstd
from kafka.errors import KafkaConnectionError, KafkaTimeoutError
from kafka.producer.future import FutureRecordMetadata
from pydantic import BaseModel

from schemas.errors import BrokerUnreachable, InvalidEvent, TrajlakeError
from schemas.events import DEFAULT_TOPIC, Event, omit_defaults
from schemas.versions import MAX_EVENT_BYTES, SCHEMA_VERSION, validate_event

log = logging.getLogger(__name__)

CODECS = {"gzip": has_gzip, "snappy": has_snappy, "lz4": has_lz4, "zstd": has_zstd}
"""Compression types and whether their library is installed (gzip needs none)."""
_REQUEST_OVERHEAD_BYTES = 64 * 1024
"""Room for the record batch framing around the largest accepted event."""


class DeliveryFailed(TrajlakeError, RuntimeError):
    """The broker refused or lost events that ``send`` had accepted."""

    def __init__(self, failures: list[BaseException]) -> None:
        self.failures = failures
        super().__init__(
            f"{len(failures)} event(s) were not delivered; first error: {failures[0]!r}. "
            "They were not acknowledged, so send them again (the ingester dedupes by event_id)."
        )


def encode_event(event: Event | Mapping[str, Any], *, max_bytes: int = MAX_EVENT_BYTES) -> tuple[bytes, bytes]:
    """Validate one event and return its Kafka ``(key, value)``.

    A dict is sent as given (so optional fields newer than this library
    survive); a model is dumped in JSON mode. Both are validated first; then
    an event of the current version loses the fields at their defaults
    (``schemas.events.omit_defaults``: read back the same, fewer bytes).
    Raises ``InvalidEvent``.
    """
    if isinstance(event, BaseModel):
        raw: dict[str, Any] = event.model_dump(mode="json")
    elif isinstance(event, Mapping):
        raw = dict(event)
    else:
        raise InvalidEvent("(event)", f"must be an Event model or a dict, got {type(event).__name__}")
    rollout_id = validate_event(raw).rollout_id
    if raw.get("schema_version") == SCHEMA_VERSION:
        raw = omit_defaults(raw)
    try:
        value = json.dumps(raw, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()
    except (TypeError, ValueError) as exc:
        raise InvalidEvent("(event)", f"not JSON-serialisable: {exc}") from None
    if len(value) > max_bytes:
        raise InvalidEvent("(event)", f"{len(value)} bytes exceeds the {max_bytes}-byte limit")
    return rollout_id.encode(), value


class EventProducer:
    """A Kafka producer of wire events. Use as a context manager or call ``close()``.

    Raises ``BrokerUnreachable`` within ``connect_timeout_s`` when no broker
    answers, at construction and on a send that cannot get metadata.
    """

    def __init__(
        self,
        bootstrap_servers: str,
        *,
        topic: str = DEFAULT_TOPIC,
        connect_timeout_s: float = 5.0,
        linger_ms: int = 10,
        batch_size: int = 512 * 1024,
        compression: str | None = None,
        max_event_bytes: int = MAX_EVENT_BYTES,
        client_id: str = "trajlake-producer",
    ) -> None:
        if compression is not None and compression not in CODECS:
            raise ValueError(f"compression must be one of {', '.join(CODECS)} or None, got {compression!r}")
        if compression is not None and not CODECS[compression]():
            raise ValueError(f"compression {compression!r} needs its Python library (see kafka-python's "
                             "compression docs); gzip needs none")
        if connect_timeout_s <= 0:
            raise ValueError(f"connect_timeout_s must be > 0, got {connect_timeout_s}")
        self.bootstrap_servers = bootstrap_servers
        self.topic = topic
        self.max_event_bytes = max_event_bytes
        self.sent = 0
        self._failures: list[BaseException] = []
        self._producer: KafkaProducer | None
        timeout_ms = int(connect_timeout_s * 1000)
        try:
            self._producer = KafkaProducer(
                bootstrap_servers=bootstrap_servers,
                client_id=client_id,
                acks="all",
                enable_idempotence=False,  # tansu: InitProducerId fails; dedupe is by event_id
                linger_ms=linger_ms,
                batch_size=batch_size,
                compression_type=compression,
                max_request_size=max_event_bytes + _REQUEST_OVERHEAD_BYTES,
                bootstrap_timeout_ms=timeout_ms,
                max_block_ms=timeout_ms,
            )
        except (KafkaTimeoutError, KafkaConnectionError) as exc:
            raise BrokerUnreachable(bootstrap_servers, "cannot start the producer") from exc
        log.debug("producer started bootstrap_servers=%s topic=%s", bootstrap_servers, topic)

    def send(self, event: Event | Mapping[str, Any]) -> FutureRecordMetadata:
        """Validate and enqueue one event (batched); ``flush()`` waits for the broker."""
        if self._producer is None:
            raise RuntimeError("this EventProducer is closed: create a new one")
        key, value = encode_event(event, max_bytes=self.max_event_bytes)
        try:
            future = self._producer.send(self.topic, key=key, value=value)
        except KafkaTimeoutError as exc:
            raise BrokerUnreachable(self.bootstrap_servers, f"cannot send to topic {self.topic!r}") from exc
        future.add_errback(self._failures.append)
        self.sent += 1
        return future

    def send_many(self, events: Iterable[Event | Mapping[str, Any]]) -> int:
        """Send events in order; returns how many were enqueued."""
        n = 0
        for event in events:
            self.send(event)
            n += 1
        return n

    def flush(self, *, timeout_s: float = 60.0) -> None:
        """Block until every sent event is acknowledged by the broker (acks=all).

        Raises ``BrokerUnreachable`` when that takes longer than ``timeout_s``
        and ``DeliveryFailed`` when the broker refused some events.
        """
        if self._producer is None:
            raise RuntimeError("this EventProducer is closed: create a new one")
        self._flush(self._producer, timeout_s)

    def _flush(self, producer: KafkaProducer, timeout_s: float) -> None:
        try:
            producer.flush(timeout=timeout_s)
        except KafkaTimeoutError as exc:
            raise BrokerUnreachable(self.bootstrap_servers, f"flush timed out after {timeout_s:g} s") from exc
        if self._failures:
            failures, self._failures = self._failures, []
            raise DeliveryFailed(failures)

    def close(self, *, timeout_s: float = 60.0) -> None:
        """Flush, then release the connection; safe to call twice.

        When the broker is gone, the undelivered events are dropped and
        ``BrokerUnreachable`` says so.
        """
        producer, self._producer = self._producer, None
        if producer is None:
            return
        try:
            self._flush(producer, timeout_s)
        except BrokerUnreachable:
            # kafka-python's close() flushes again and raises; stop its sender without sending.
            producer._sender.force_close()
            producer._sender.join(timeout_s)
            producer.close(timeout=0)
            raise
        except DeliveryFailed:
            producer.close(timeout=timeout_s)
            raise
        producer.close(timeout=timeout_s)

    def __enter__(self) -> EventProducer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["BrokerUnreachable", "DeliveryFailed", "EventProducer", "encode_event"]
