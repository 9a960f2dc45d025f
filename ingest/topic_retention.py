"""How long a topic keeps raw events: its ``retention.ms``, asked of the broker (``DescribeConfigs``).

``trajlake forget`` deletes from the lake only; the raw events stay in the
topic until its retention drops them, so the command says when that will be
(or why it cannot tell: tansu, the embedded broker, does not implement
``DescribeConfigs`` and closes the connection).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from kafka.admin import ConfigResource, ConfigResourceType, KafkaAdminClient
from kafka.errors import KafkaError

from ingest.consumer import quiet_client_logs

RETENTION_KEY = "retention.ms"


@dataclass(frozen=True)
class TopicRetention:
    """A topic's ``retention.ms`` (-1: kept forever), or None with the reason it is unknown."""

    topic: str
    retention_ms: int | None
    reason: str = ""

    def dropped_by(self, written_before: datetime) -> datetime | None:
        """When every event written before ``written_before`` is past retention (None: never, or unknown).

        Kafka deletes whole closed segments, so the events can outlive this by up to the topic's ``segment.ms``.
        """
        if self.retention_ms is None or self.retention_ms < 0:
            return None
        return written_before + timedelta(milliseconds=self.retention_ms)


def topic_retention(bootstrap_servers: str, topic: str, *, timeout_s: float = 5.0) -> TopicRetention:
    """Ask the broker for ``topic``'s ``retention.ms``; never raises (an unknown answer says why)."""
    timeout_ms = int(timeout_s * 1000)
    try:
        with quiet_client_logs():
            admin = KafkaAdminClient(bootstrap_servers=bootstrap_servers, request_timeout_ms=timeout_ms,
                                     bootstrap_timeout_ms=timeout_ms, client_id="trajlake-forget")
            try:
                responses = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic,
                                                                   configs=[RETENTION_KEY])])
            finally:
                admin.close()
    except (KafkaError, OSError, ValueError) as exc:
        if "bootstrap" in str(exc).lower():
            return TopicRetention(topic, None, f"no broker answered at {bootstrap_servers} within {timeout_s:g} s")
        return TopicRetention(topic, None, f"the broker at {bootstrap_servers} did not answer DescribeConfigs "
                                           f"({exc}; tansu, the embedded broker, does not implement it)")
    return _parse(topic, responses)


def _parse(topic: str, responses: object) -> TopicRetention:
    for response in responses if isinstance(responses, list) else [responses]:
        for resource in getattr(response, "resources", []):
            error_code, error_message, _kind, _name, entries = resource[:5]
            if error_code:
                return TopicRetention(topic, None, f"the broker refused DescribeConfigs: {error_message or error_code}")
            for entry in entries:
                if entry[0] == RETENTION_KEY and entry[1] is not None:
                    return TopicRetention(topic, int(entry[1]))
    return TopicRetention(topic, None, f"the broker's answer held no {RETENTION_KEY} for topic {topic!r}")
