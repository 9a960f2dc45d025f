"""Reading events of every schema version: bytes -> validated ``Event``.

``SCHEMA_VERSION`` is what producers write today. ``UPGRADES[v]`` turns a
version-``v`` event (a plain dict) into version ``v + 1``; the reader applies
them in a chain, so an event from any version ever accepted still reads.
When a breaking change bumps the version, add its upgrade here and keep the
old ones.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

from pydantic import ValidationError

from schemas.errors import InvalidEvent
from schemas.events import EVENT_ADAPTER, EVENT_TYPES, Event

SCHEMA_VERSION = 1
MIN_SCHEMA_VERSION = 1
MAX_EVENT_BYTES = 4 * 1024 * 1024
"""Largest accepted event (the broker enforces no limit, so we do)."""

Upgrade = Callable[[dict[str, Any]], dict[str, Any]]
UPGRADES: dict[int, Upgrade] = {}
"""``UPGRADES[v]`` maps a version-``v`` event dict to version ``v + 1`` (it gets a copy)."""


def upgrade(raw: dict[str, Any]) -> dict[str, Any]:
    """Bring a decoded event of any accepted version to ``SCHEMA_VERSION``."""
    version = raw.get("schema_version")
    if isinstance(version, bool) or not isinstance(version, int):
        raise InvalidEvent("schema_version", f"must be an integer, got {version!r}")
    if version > SCHEMA_VERSION:
        raise InvalidEvent(
            "schema_version",
            f"{version} is newer than this reader ({SCHEMA_VERSION}): upgrade trajlake",
        )
    if version < MIN_SCHEMA_VERSION:
        raise InvalidEvent(
            "schema_version", f"{version} was never a valid version (first is {MIN_SCHEMA_VERSION})"
        )
    while version < SCHEMA_VERSION:
        step = UPGRADES.get(version)
        if step is None:
            raise InvalidEvent("schema_version", f"no upgrade from version {version}: this reader cannot read it")
        raw = step(dict(raw))  # a copy: the caller's dict stays as it was
        version += 1
        raw["schema_version"] = version
    return raw


def decode_event(data: bytes | str, *, max_bytes: int = MAX_EVENT_BYTES) -> Event:
    """Parse and validate one wire event.

    Raises ``InvalidEvent`` naming the field and the problem, e.g.
    ``payload.prompt_token_ids.3: Input should be a valid integer``.

    >>> decode_event(b'{"type": "reward"}')  # doctest: +SKIP
    InvalidEvent: event_id: Field required; ...
    """
    size = len(data)
    if size > max_bytes:
        raise InvalidEvent("(event)", f"{size} bytes exceeds the {max_bytes}-byte limit")
    try:
        # Fast path (~1.6x): parse and validate in one pass, strictly. Anything it
        # refuses, and every older version, takes the full path below, which
        # upgrades, accepts what lax validation accepts, and names the problem.
        event = EVENT_ADAPTER.validate_json(data, strict=True)
        if event.schema_version == SCHEMA_VERSION:
            return _finite(event)
    except ValidationError:
        pass
    try:
        raw = json.loads(data)
    except ValueError as exc:  # invalid JSON or UTF-8, and integers past Python's 4,300-digit conversion limit
        raise InvalidEvent("(event)", f"not valid JSON: {exc}") from None
    except RecursionError:
        raise InvalidEvent("(event)", "JSON nested too deeply") from None
    if not isinstance(raw, dict):
        raise InvalidEvent("(event)", f"must be a JSON object, got {type(raw).__name__}")
    if _escapes(data) and (where := unencodable_path(raw)) is not None:
        raise InvalidEvent(where or "(event)", UNENCODABLE)
    return validate_event(raw)


def validate_event(raw: dict[str, Any]) -> Event:
    """Validate an already-decoded event dict (any accepted schema version)."""
    if not isinstance(raw, dict):
        raise InvalidEvent("(event)", f"must be a JSON object, got {type(raw).__name__}")
    event_type = raw.get("type")
    if event_type not in EVENT_TYPES:
        raise InvalidEvent("type", f"unknown event type {event_type!r}; known: {', '.join(EVENT_TYPES)}")
    raw = upgrade(raw)
    try:
        event = EVENT_ADAPTER.validate_python(raw)
    except ValidationError as exc:
        raise InvalidEvent.from_validation(exc, union_tags=EVENT_TYPES) from None
    except RecursionError:
        raise InvalidEvent("(event)", "JSON nested too deeply") from None
    return _finite(event)


NON_FINITE = "NaN and Infinity are not JSON: send a finite number (or null)"


def non_finite_path(value: Any) -> str | None:
    """Where ``value`` (decoded JSON) holds a NaN or +-Infinity float: a dotted path (``""`` for the value itself), else None.

    Python's ``json`` reads ``NaN``, ``Infinity`` and numbers that overflow a
    double (``1e400``) into such floats; JSON has no such numbers.
    """
    try:
        json.dumps(value, allow_nan=False, default=str)  # C speed; the walk only names the place
        return None
    except ValueError:
        return _first_path(value, lambda node: isinstance(node, float) and not math.isfinite(node))


UNENCODABLE = ("holds a lone UTF-16 surrogate escape (\\ud800-\\udfff alone is no Unicode character and no stored "
               "text can hold it): send UTF-8 text")


def unencodable_path(value: Any) -> str | None:
    """Where ``value`` (decoded JSON) holds a string or key that UTF-8 cannot encode: a dotted path (``""`` for the
    value itself), else None. Python's ``json`` reads a lone surrogate escape (``"\\ud800"``) into such a string; it
    then fails every encoder after validation (Parquet, Kafka, the quarantine's text), so it is refused here."""
    try:
        json.dumps(value, ensure_ascii=False, default=str).encode()  # C speed; the walk only names the place
        return None
    except UnicodeEncodeError:
        return _first_path(value, lambda node: isinstance(node, str) and not _encodable(node))


def _first_path(value: Any, bad: Callable[[Any], bool]) -> str | None:
    """The dotted path of the first value or key in ``value`` for which ``bad`` holds (a key's path is where it
    leads, written with backslash escapes), else None."""
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:
        path, node = stack.pop()
        if bad(node):
            return path
        if isinstance(node, dict):
            for key, child in node.items():
                where = f"{path}.{key}" if path else str(key)
                if bad(key):
                    return where.encode("utf-8", "backslashreplace").decode()
                stack.append((where, child))
        elif isinstance(node, (list, tuple)):
            stack.extend((f"{path}.{i}" if path else str(i), v) for i, v in enumerate(node))
    return None


def _encodable(text: str) -> bool:
    try:
        text.encode()
        return True
    except UnicodeEncodeError:
        return False


class UnstorableValue(ValueError):
    """JSON text holding a value no table can store: ``NaN``, ``Infinity`` or a number that overflows a double, or a
    string UTF-8 cannot encode (``problem`` says which); ``path`` says where."""

    def __init__(self, path: str, problem: str = NON_FINITE) -> None:
        self.path = path
        super().__init__(f"{path or '(body)'}: {problem}")


def loads_finite(data: bytes | str) -> Any:
    """``json.loads`` that refuses the numbers JSON does not have and strings UTF-8 cannot encode; raises
    ``UnstorableValue`` naming the place.

    The hooks cost a Python call per float only; the walk that names the place runs only when one was seen.
    """
    seen = False

    def constant(text: str) -> float:  # NaN, Infinity, -Infinity
        nonlocal seen
        seen = True
        return float(text)

    def number(text: str) -> float:
        nonlocal seen
        value = float(text)
        seen = seen or math.isinf(value)
        return value

    value = json.loads(data, parse_constant=constant, parse_float=number)
    if seen:
        raise UnstorableValue(non_finite_path(value) or "")
    if _escapes(data) and (where := unencodable_path(value)) is not None:
        raise UnstorableValue(where, UNENCODABLE)
    return value


def _escapes(data: bytes | str) -> bool:
    """Whether ``data`` has a ``\\u`` escape: only one can make a string UTF-8 cannot encode."""
    return (b"\\u" in data) if isinstance(data, bytes) else ("\\u" in data)


def _finite(event: Event) -> Event:
    """``event`` unless a free-form JSON value of its payload (tool arguments, metadata, messages) holds NaN/Infinity.

    Typed number fields refuse them already (``allow_inf_nan=False``); values
    typed ``Any`` are taken as they come, so they are checked here.
    """
    path = non_finite_path(dict(event.payload))
    if path is not None:
        raise InvalidEvent(f"payload.{path}", NON_FINITE)
    return event
