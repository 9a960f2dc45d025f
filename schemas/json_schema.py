"""The wire contract as JSON Schema (draft 2020-12), generated from the event models.

``schemas/event.schema.json`` is this module's output, committed so that
producers in other languages can validate an event before they send it;
``tests/schemas/test_json_schema.py`` fails when it falls behind the models.
Regenerate it with ``python -m schemas.json_schema``.

The schema checks structure and types. A few rules live only in the models
(token ids within int32, one logprob per response token, a UTC offset on
``ts``, finite reward values, a prefix reference's ``extends_call_id`` and
``extends_tokens`` sent together); the ingester still quarantines an event that
breaks them, naming the rule.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from schemas.events import EVENT_ADAPTER
from schemas.versions import SCHEMA_VERSION

SCHEMA_PATH = Path(__file__).with_name("event.schema.json")
SCHEMA_ID = f"https://trajlake.dev/schemas/event/v{SCHEMA_VERSION}.schema.json"


def event_json_schema() -> dict[str, Any]:
    """The JSON Schema of one wire event (any type), for ``SCHEMA_VERSION``.

    >>> jsonschema.validate(event, event_json_schema())  # doctest: +SKIP
    """
    schema = EVENT_ADAPTER.json_schema(mode="validation")
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": SCHEMA_ID,
        "title": f"trajlake event (schema_version {SCHEMA_VERSION})",
        "description": "One JSON object per Kafka message, key = rollout_id. Documented in schemas/EVENTS.md; "
                       "generated from schemas/events.py by `python -m schemas.json_schema`.",
        **schema,
    }


def render() -> str:
    """The committed file's exact text."""
    return json.dumps(event_json_schema(), indent=2, sort_keys=True) + "\n"


def main() -> None:
    """Write ``schemas/event.schema.json``."""
    SCHEMA_PATH.write_text(render())
    sys.stdout.write(f"wrote {SCHEMA_PATH.name}\n")


if __name__ == "__main__":
    main()
