"""Redaction rules: remove secrets and personal data from events before they reach the lake.

Applied by the gateway (before an event is sent to Kafka or written to its
spool) and by the ingester (to every valid event before its rows are built,
for producers that bypass the gateway). Pure: no FastAPI, no Kafka.

Rules come from a JSON or TOML file (``TRAJLAKE_REDACTION_RULES`` = its path)::

    [[rules]]
    name = "openai_key"                 # letters, digits, _ . -; shown in the marker
    pattern = 'sk-[A-Za-z0-9_-]{20,}'   # Python regex
    # ignore_case = true

    [[rules]]
    name = "email"
    pattern = '[\\w.+-]+@[\\w-]+\\.[\\w.]+'
    requires = "@"                      # optional: skip strings without it (speed)

    [[rules]]
    name = "user_email"
    field = "payload.metadata.user_email"
    events = ["rollout.started"]        # optional: only these event types
    tenants = ["acme"]                  # optional: only these tenants

A ``pattern`` rule replaces each match with ``[REDACTED:<name>]`` in these
string values, and nowhere else (keys, numbers, ids are never touched):

- ``rollout.started``: every string inside ``metadata``
- ``rollout.finished``: ``reason``
- ``llm.request``: ``prompt``; every string inside ``messages`` (contents,
  content parts, names, tool-call arguments) except the values of the keys
  ``role``, ``type``, ``id`` and ``tool_call_id``; every string inside ``params``
  (``user``, ``metadata``, ...). Not ``tools`` (the developer's schemas: use a
  field rule), not ``model``.
- ``llm.response``: ``text``, ``error``; every string inside ``tool_calls``
  except the values of ``type`` and ``id``.
- ``tool.call``: every string inside ``arguments``; ``tool.result``: every
  string inside ``result``, and ``error``. ``reward``: nothing.

A string holding a JSON object or array (OpenAI's tool-call ``arguments``, a
tool's JSON result) is parsed and its string values are redacted one by one,
so the result stays valid JSON (re-serialised only when something matched).
A pattern sees one string value at a time: ``^``/``$`` anchor at its ends.

A ``field`` rule replaces the value at a path below ``payload`` whole (any
type) with the marker: ``payload.metadata.user_email``,
``arguments.api_key`` (``payload.`` may be left out), ``messages[*].name``,
``messages[0].content``. ``[*]`` is every element of a list, ``[N]`` one
(``messages[N]``: the N-th of the call's full messages, also when a messages
reference stores only the later ones); a
step into a string holding JSON descends into that JSON. It applies to the
event types whose payload has the path's first field (or those in
``events``). Only free-form fields can be named (``FIELD_ROOTS``); ids, token
ids and typed fields cannot. A field rule names one place: a tool argument
redacted in ``tool.call`` events is still in the history of later
``llm.request`` messages unless a second rule names it there too
(``messages[*].tool_calls[*].function.arguments.api_key``) or a pattern
catches it everywhere.

Messages references (``ingest.prefix_refs``) store a call's history once: the
rules see the messages a call stores, and the shared ones were seen (and
redacted) in the earlier calls that stored them, all but the harness's echo of
an answer, which a reference rebuilds from the ``llm.response`` (where rules on
``llm.request`` messages do not reach); and a call's prompt ids encode its
shared messages as sent. So a producer of references asks ``changes_history``:
an echo the rules would change is never counted (the next call sends it, and
it is redacted there), and a call whose FULL messages or tools the rules would
change sends no prompt ids (nor a prompt-id reference), as if sent whole. The
gateway does (its own rules); the SDK does when given the rules
(``TrajectoryClient(redactor=...)``, ``TRAJLAKE_REDACTION_RULES``): an SDK
sending references without them can hide echoed answers from ``messages``
rules and keep ids of shared messages the rules redacted.

Token ids (the choice; why): the ids of a redacted text encode the secret just
as the text does, and ids of the redacted text would not be what the engine
saw or sampled. So when a rule changes the token-bearing text of an
``llm.request`` (``messages``, ``prompt``, ``tools``) its ``prompt_token_ids``
are dropped; of an ``llm.response`` (``text``, ``tool_calls``) its
``response_token_ids`` and ``logprobs`` are dropped and ``token_source``
becomes ``none``. Such a call is ``non_engine`` in ``pipelines.datasets.calls`` and is
never trained, even with ``--allow-non-engine`` (that needs both token lists);
no sample starts from it or extends through it: the calls before it are
trained as usual and merging starts a new sample at the next call that has
ids again. It is consistent: a later call whose prompt still carries
the secret (conversation history) matches the same pattern and loses its ids
too. Retokenizing the redacted text was rejected: the model would learn to
emit ``[REDACTED:...]`` and the old logprobs would not match. A hit only in
``params`` or ``error`` keeps the ids (they do not encode those).

Cost (gateway: on the emitter thread, off the request path; ingester: per
event): none without rules (no redactor is built). With 3 patterns and a
field rule, a 10.8 KB agent ``llm.request`` (10 messages, 3 tool calls) plus its
``llm.response`` took 39-42 us when nothing matched and 52-61 us when a
secret did, against 39-46 us to JSON-encode the two events (median of 5 runs
of 3,000, on the shared 2-core box). In the ingester, the same rules made
``Batch.decode`` (validate, dedupe, build rows) of a 2,881-event synthetic
workload 11-19% slower (7-11 us per event). A producer of messages references
asks ``changes_history`` of each call's full messages (the gateway on its
emitter thread): what redacting the call sent whole costs (62 messages, 36 KB,
the same rules: 1.6-2.1 ms against 1.9 ms for ``redact`` of that request, at
load 15-16), only with rules. Patterns run one by one (Python's
``re`` finds a literal prefix such as ``sk-`` fast); a pattern that starts
with a character class scans every position (an email pattern: ~300 us over
3 KB), which ``requires`` avoids.

Quarantine (invalid input) keeps raw bytes, which no field rule can address;
the ingester runs the pattern rules over the raw text (``redact_raw``) and the
rejection reason, best effort: a secret written with JSON ``\\u`` escapes in
invalid input is not recognised.
"""

from __future__ import annotations

import json
import logging
import re
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import msgspec
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from schemas.events import EVENT_TYPES, PAYLOAD_MODELS
from schemas.errors import SettingsInvalid

log = logging.getLogger(__name__)

EventType = Literal["rollout.started", "rollout.finished", "llm.request", "llm.response", "tool.call",
                    "tool.result", "reward"]

_STRUCTURAL = frozenset({"role", "type", "id", "tool_call_id"})
_NOTHING: frozenset[str] = frozenset()

TEXT_FIELDS: dict[str, tuple[tuple[str, frozenset[str]], ...]] = {
    "rollout.started": (("metadata", _NOTHING),),
    "rollout.finished": (("reason", _NOTHING),),
    "llm.request": (("prompt", _NOTHING), ("messages", _STRUCTURAL), ("params", _NOTHING)),
    "llm.response": (("text", _NOTHING), ("tool_calls", _STRUCTURAL), ("error", _NOTHING)),
    "tool.call": (("arguments", _NOTHING),),
    "tool.result": (("result", _NOTHING), ("error", _NOTHING)),
    "reward": (),
}
"""Per event type: the payload fields pattern rules scan, and the keys whose values they skip inside them."""

FIELD_ROOTS: dict[str, bool] = {
    "metadata": True, "params": True, "messages": True, "tools": True, "tool_calls": True,
    "prompt": False, "text": False, "error": False, "reason": False, "arguments": False, "result": False,
}
"""Payload fields a field rule may start at; True = a container, so the path must name a key inside it."""

TOKEN_TEXT: dict[str, frozenset[str]] = {
    "llm.request": frozenset({"messages", "prompt", "tools"}),
    "llm.response": frozenset({"text", "tool_calls"}),
}
"""Fields whose text the event's token ids encode: redacting them drops the ids."""

_DROPPED_IDS: dict[str, dict[str, Any]] = {
    "llm.request": {"prompt_token_ids": None, "extends_tokens": None},  # no ids, no prefix reference
    "llm.response": {"response_token_ids": None, "logprobs": None, "token_source": "none"},
}


class RedactionConfigError(SettingsInvalid):
    """The rules file cannot be used; the message names the rule and what to fix."""


def marker(name: str) -> str:
    """The replacement text of rule ``name``."""
    return f"[REDACTED:{name}]"


# ------------------------------------------------------------------ rules and paths


class RedactionRule(BaseModel):
    """One rule as written in the rules file: exactly one of ``pattern`` and ``field``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    pattern: str | None = None
    field: str | None = None
    ignore_case: bool = False
    requires: str | None = Field(default=None, min_length=1)
    """A substring every match contains: strings without it skip the regex (``@`` for an email pattern)."""
    events: list[EventType] | None = Field(default=None, min_length=1)
    tenants: list[str] | None = Field(default=None, min_length=1)

    @model_validator(mode="after")
    def _usable(self) -> RedactionRule:
        if (self.pattern is None) == (self.field is None):
            raise ValueError("give exactly one of 'pattern' (a regex) and 'field' (a path such as "
                             "payload.metadata.email)")
        if self.requires is not None and self.pattern is None:
            raise ValueError("'requires' speeds up a 'pattern' rule; a field rule has no use for it")
        if self.requires is not None and self.ignore_case and self.requires.lower() != self.requires.upper():
            raise ValueError("'requires' is compared case-sensitively: with ignore_case use one without letters")
        if self.pattern is not None:
            _compile(self)
        else:
            root = parse_field_path(self.field)[0]
            if self.events is not None and not any(root in PAYLOAD_MODELS[t].model_fields for t in self.events):
                raise ValueError(f"none of the events {self.events} has a payload field {root!r}")
        return self


class _Every:
    """The ``[*]`` step of a field path."""

    def __repr__(self) -> str:
        return "[*]"


EVERY = _Every()
Step = str | int | _Every
_SEGMENT = re.compile(r"([A-Za-z_][A-Za-z0-9_\-]*)((?:\[(?:\*|\d+)\])*)")


def parse_field_path(text: str) -> tuple[Step, ...]:
    """``payload.messages[*].name`` -> ("messages", EVERY, "name"); raises ``ValueError`` naming the problem.

    >>> parse_field_path("metadata.user_email")
    ('metadata', 'user_email')
    """
    body = text[len("payload."):] if text.startswith("payload.") else text
    steps: list[Step] = []
    for segment in body.split("."):
        match = _SEGMENT.fullmatch(segment)
        if match is None:
            raise ValueError(
                f"{text!r}: cannot read {segment!r}; write keys joined by '.', each optionally followed by "
                "[*] (every element) or [N] (element N), e.g. payload.messages[*].name"
            )
        steps.append(match.group(1))
        for index in re.findall(r"\[(\*|\d+)\]", match.group(2)):
            steps.append(EVERY if index == "*" else int(index))
    root = steps[0]
    if root not in FIELD_ROOTS:
        raise ValueError(f"field {text!r}: the payload field {root!r} cannot be redacted; a field rule starts at "
                         f"one of {sorted(FIELD_ROOTS)}")
    if FIELD_ROOTS[root] and not any(isinstance(s, str) for s in steps[1:]):
        raise ValueError(f"{text!r}: {root!r} is a list/object the contract types; name a key inside it, "
                         f"e.g. {root}{'[*].content' if root == 'messages' else '.some_key'}")
    return tuple(steps)


@dataclass(frozen=True)
class _FieldRule:
    name: str
    steps: tuple[Step, ...]


@dataclass(frozen=True)
class _PatternRule:
    name: str
    regex: re.Pattern[str]
    requires: str | None
    replacement: str

    def sub(self, text: str) -> tuple[str, int]:
        if self.requires is not None and self.requires not in text:
            return text, 0
        return self.regex.subn(self.replacement, text)


@dataclass(frozen=True)
class _TypeRules:
    """The rules for one event type (of one tenant), compiled.

    Each pattern is searched on its own: Python's ``re`` finds a literal
    prefix (``sk-``, ``AKIA``) fast, and a combined alternation would lose that
    (measured: 35 us against 1.6 + 1.5 us over 3 KB of chat).
    """

    patterns: tuple[_PatternRule, ...]
    fields: tuple[_FieldRule, ...]

    @classmethod
    def build(cls, rules: Iterable[RedactionRule], event_type: str | None) -> _TypeRules:
        """``event_type`` None: the pattern rules of any type (raw text)."""
        rules = [r for r in rules if event_type is None or r.events is None or event_type in r.events]
        patterns = tuple(_PatternRule(r.name, _compile(r), r.requires, marker(r.name))
                         for r in rules if r.pattern is not None)
        fields = tuple(_FieldRule(r.name, parse_field_path(r.field)) for r in rules
                       if r.field is not None and event_type is not None and _field_applies(r, event_type))
        return cls(patterns, fields)

    @property
    def empty(self) -> bool:
        return not self.patterns and not self.fields


def _rules_by_type(rules: Iterable[RedactionRule]) -> dict[str, _TypeRules]:
    rules = list(rules)
    return {t: _TypeRules.build(rules, t) for t in EVENT_TYPES}


def _field_applies(rule: RedactionRule, event_type: str) -> bool:
    root = parse_field_path(rule.field)[0]
    wanted = rule.events is None or event_type in rule.events
    return wanted and root in PAYLOAD_MODELS[event_type].model_fields


def _compile(rule: RedactionRule) -> re.Pattern[str]:
    try:
        regex = re.compile(rule.pattern, re.IGNORECASE if rule.ignore_case else 0)
    except re.error as exc:
        raise ValueError(f"invalid regex {rule.pattern!r}: {exc}") from None
    if regex.fullmatch(""):
        raise ValueError(f"pattern {rule.pattern!r} matches the empty string; it would insert markers "
                         "everywhere: make it match at least one character")
    return regex


# ------------------------------------------------------------------ the redactor


class Redactor:
    """Applies a list of rules to events; compiled once, shared by threads (it holds no mutable state).

    >>> redactor = Redactor([RedactionRule(name="key", pattern="sk-[a-z0-9]{8,}")])
    >>> redactor.redact_text("use sk-abcdef123 now")
    'use [REDACTED:key] now'
    """

    def __init__(self, rules: Iterable[RedactionRule]) -> None:
        self.rules = tuple(rules)
        names = [r.name for r in self.rules]
        if len(set(names)) != len(names):
            twice = sorted({n for n in names if names.count(n) > 1})
            raise RedactionConfigError(f"rule names must be unique (they appear in the markers): {twice} repeat")
        self._default = _rules_by_type(r for r in self.rules if r.tenants is None)
        tenants = {t for r in self.rules for t in (r.tenants or ())}
        self._by_tenant = {t: _rules_by_type(r for r in self.rules if r.tenants is None or t in r.tenants)
                           for t in tenants}
        self._untenanted_text = _TypeRules.build((r for r in self.rules if r.tenants is None), None)
        self._raw = _TypeRules.build(self.rules, None)

    def redact(self, event: Any) -> Any:
        """The event with its secrets replaced; the SAME object when no rule matched.

        Takes a pydantic ``schemas.events`` event or a ``schemas.fast`` Struct;
        returns the same kind.
        """
        rules = self._by_tenant.get(event.tenant, self._default)[event.type]
        if rules.empty:
            return event
        payload = event.payload
        hits: list[str] = []
        changes: dict[str, Any] = {}
        for name, skip in TEXT_FIELDS[event.type] if rules.patterns else ():
            value = getattr(payload, name)
            new = _scan(value, rules, skip, hits)
            if new is not value:
                changes[name] = new
        for rule in rules.fields:
            root, steps = rule.steps[0], _in_stored_messages(rule.steps, payload)
            if steps is None:
                continue
            value = changes.get(root, getattr(payload, root))
            new = _at_path(value, steps[1:], marker(rule.name))
            if new is not value:
                changes[root] = new
                hits.append(rule.name)
        if not changes:
            return event
        log.debug("redacted event_id=%s type=%s rules=%s fields=%s", event.event_id, event.type,
                  ",".join(dict.fromkeys(hits)), ",".join(changes))
        if TOKEN_TEXT.get(event.type, _NOTHING).intersection(changes):
            changes.update(_DROPPED_IDS[event.type])
            if event.type == "llm.request" and payload.extends_messages is None and payload.extends_tools is None:
                changes["extends_call_id"] = None  # the reference was the ids' only
        return _replaced(event, payload=_replaced(payload, **changes))

    def changes_history(self, tenant: str, messages: list[Any] | None, tools: list[Any] | None,
                        answer: dict[str, Any] | None = None) -> tuple[bool, bool]:
        """For a producer of messages references (``ingest.prefix_refs``), about one ``llm.request`` of ``tenant``
        with these FULL ``messages`` and ``tools`` and the message its ``answer`` rebuilds to (its echo in the next
        call, ``schemas.answer_message``): (whether the rules change those messages or tools, whether they change
        the echo as the message after them).

        The first: its prompt ids must go, as when it is sent whole (the messages a reference shares are stored,
        redacted, in the earlier calls, but the ids encode them as sent). The second: the next call must not count
        the echo but send it, to be redacted there (a counted echo is rebuilt from the ``llm.response``, which
        rules on ``llm.request`` messages do not reach).

        >>> redactor = Redactor([RedactionRule(name="answer", field="messages[1].content")])
        >>> redactor.changes_history("acme", [{"role": "user", "content": "hi"}], None, {"content": "yo"})
        (False, True)
        """
        rules = self._by_tenant.get(tenant, self._default)["llm.request"]
        if rules.empty:
            return False, False
        return (_changes(rules, messages, tools),
                answer is not None and _changes(rules, [answer], None, first=len(messages or ())))

    def redact_text(self, text: str) -> str:
        """Free text of no known tenant or type (a rejection reason): the pattern rules without a tenant scope."""
        rules = self._untenanted_text
        return _text(text, rules, [])

    def redact_raw(self, raw: bytes) -> bytes:
        """Raw input (quarantine): EVERY pattern rule (any tenant, any type) over its text; undecodable bytes kept."""
        if not self._raw.patterns:
            return raw
        text = raw.decode("utf-8", errors="surrogateescape")
        redacted = _substituted(text, self._raw, [])
        return raw if redacted is text else redacted.encode("utf-8", errors="surrogateescape")


def _in_stored_messages(steps: tuple[Step, ...], payload: Any) -> tuple[Step, ...] | None:
    """A field rule's path in the payload as stored: ``messages[N]`` names the N-th message of the call's FULL
    messages, which a messages reference (``extends_messages`` = k) stores from k on: there it is ``[N - k]``,
    and None when N < k (that message was stored, and redacted, in an earlier call of the chain, or it is an
    answer's echo, which a producer counts only when the rules leave it as it is: ``changes_history``)."""
    shared = getattr(payload, "extends_messages", None)
    if not shared or steps[0] != "messages" or len(steps) < 2 or not isinstance(steps[1], int):
        return steps
    return None if steps[1] < shared else (steps[0], steps[1] - shared, *steps[2:])


def _changes(rules: _TypeRules, messages: list[Any] | None, tools: list[Any] | None, *, first: int = 0) -> bool:
    """Whether ``rules`` change ``messages`` (messages ``first`` on of a call's full messages) or ``tools``."""
    if rules.patterns and messages and _scan(messages, rules, _STRUCTURAL, []) is not messages:
        return True
    for rule in rules.fields:
        root, steps = rule.steps[0], rule.steps[1:]
        if root == "messages" and isinstance(steps[0], int):
            if not first <= steps[0] < first + len(messages or ()):
                continue
            steps = (steps[0] - first, *steps[1:])
        value = messages if root == "messages" else tools if root == "tools" else None
        if value is not None and _at_path(value, steps, marker(rule.name)) is not value:
            return True
    return False


def _replaced(obj: Any, **changes: Any) -> Any:
    if isinstance(obj, BaseModel):
        return obj.model_copy(update=changes)
    return msgspec.structs.replace(obj, **changes)


def _scan(value: Any, rules: _TypeRules, skip: frozenset[str], hits: list[str]) -> Any:
    """``value`` with pattern matches replaced in its strings; the same object when nothing matched."""
    kind = type(value)
    if kind is str:
        return _text(value, rules, hits)
    if kind is dict:
        out = None
        for key, item in value.items():
            if key in skip:
                continue
            new = _scan(item, rules, skip, hits)
            if new is not item:
                out = out if out is not None else dict(value)
                out[key] = new
        return value if out is None else out
    if kind is list:
        out = None
        for i, item in enumerate(value):
            new = _scan(item, rules, skip, hits)
            if new is not item:
                out = out if out is not None else list(value)
                out[i] = new
        return value if out is None else out
    return value


def _text(text: str, rules: _TypeRules, hits: list[str]) -> str:
    nested = _json_container(text) if text[:1] in _JSON_STARTS or text[:1].isspace() else None
    if nested is not None:
        new = _scan(nested, rules, _NOTHING, hits)
        return text if new is nested else json.dumps(new, ensure_ascii=False)
    return _substituted(text, rules, hits)


def _substituted(text: str, rules: _TypeRules, hits: list[str]) -> str:
    """``text`` with every pattern's matches replaced; the same object when none matched."""
    out, matched = text, False
    for rule in rules.patterns:
        out, n = rule.sub(out)
        if n:
            hits.append(rule.name)
            matched = True
    return out if matched else text


_JSON_STARTS = frozenset("{[")


def _json_container(text: str) -> dict | list | None:
    """The JSON object or array a string holds, else None (cheap first-character test before parsing)."""
    start = text.lstrip()[:1]
    if start not in ("{", "["):
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, (dict, list)) else None


def _at_path(value: Any, steps: tuple[Step, ...], replacement: str) -> Any:
    """``value`` with what ``steps`` reach replaced by ``replacement``; the same object when the path is absent."""
    if not steps:  # null stays null; an already redacted value is left as it is (gateway, then ingester)
        return value if value is None or value == replacement else replacement
    if isinstance(value, str):
        nested = _json_container(value)
        if nested is None:
            return value
        new = _at_path(nested, steps, replacement)
        return value if new is nested else json.dumps(new, ensure_ascii=False)
    step, rest = steps[0], steps[1:]
    if isinstance(step, str):
        if not isinstance(value, dict) or step not in value:
            return value
        new = _at_path(value[step], rest, replacement)
        return value if new is value[step] else {**value, step: new}
    if not isinstance(value, list):
        return value
    indices = range(len(value)) if step is EVERY else [step] if step < len(value) else []
    out = None
    for i in indices:
        new = _at_path(value[i], rest, replacement)
        if new is not value[i]:
            out = out if out is not None else list(value)
            out[i] = new
    return value if out is None else out


# ------------------------------------------------------------------ loading


def load_rules(path: Path) -> Redactor:
    """Read a rules file (``.json`` or ``.toml``, a top-level ``rules`` list); raises ``RedactionConfigError``."""
    path = Path(path)
    if path.suffix not in (".json", ".toml"):
        raise RedactionConfigError(f"redaction rules {path}: name the file *.json or *.toml")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise RedactionConfigError(f"cannot read redaction rules {path}: {exc}") from None
    try:
        doc = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
    except ValueError as exc:  # TOMLDecodeError and JSONDecodeError are ValueErrors
        raise RedactionConfigError(f"redaction rules {path} is not valid {path.suffix[1:].upper()}: {exc}") from None
    if not isinstance(doc, dict) or set(doc) != {"rules"} or not isinstance(doc["rules"], list):
        raise RedactionConfigError(f"redaction rules {path}: the file must hold exactly one key, 'rules', a list "
                                   "of rules ([[rules]] tables in TOML)")
    rules = []
    for i, item in enumerate(doc["rules"]):
        try:
            rules.append(RedactionRule.model_validate(item))
        except ValidationError as exc:
            first = exc.errors(include_url=False)[0]
            where = "".join(f" {p}" for p in first["loc"][:1])
            name = item.get("name") if isinstance(item, dict) else None
            problem = first["msg"].removeprefix("Value error, ")
            raise RedactionConfigError(f"redaction rules {path}: rule {i} ({name!r}){where}: {problem}") from None
    return Redactor(rules)


def load_redactor(path: Path | None) -> Redactor | None:
    """The redactor of a configured rules file, or None when none is configured (nothing to do per event)."""
    if path is None:
        return None
    redactor = load_rules(path)
    return redactor if redactor.rules else None
