"""Turn one proxied call into its ``llm.request`` and ``llm.response`` events (off the hot path).

``seq``: the gateway cannot know the harness's step counter, so it uses
microseconds since the Unix epoch at which the gateway received the request
(``llm.request``) and finished the answer (``llm.response``, strictly later).
That is monotonic per rollout across gateway restarts and replicas (as far as
their clocks agree), which a per-process counter would not be.

Event ids: random UUIDv7, except for a call with an idempotency key, whose
request and successful response get ids derived from (tenant, key, request
fingerprint), so a retried call is stored once. Error answers always get
fresh ids.
"""

from __future__ import annotations

import json
import logging
import math
from array import array
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from ingest.gateway.identity import CallIdentity, RolloutIdentity, stable_id
from ingest.gateway.retokenize import Retokenizer
from ingest.gateway.tokens import Completion, Kind, read_completion
from ingest.ids import uuid7
from ingest.gateway.sessions.state import SessionKey, SessionStore
from ingest.prefix_refs import Digests, MessagesReference, PreviousCall, Reference, digests, remembered, shared_messages, \
    shared_prefix
from ingest.redaction import Redactor
from schemas.answer_message import answer_message
from schemas.events import Event, LlmRequest, LlmRequestEvent, LlmResponse, LlmResponseEvent
from schemas.versions import SCHEMA_VERSION

log = logging.getLogger(__name__)

_NOT_PARAMS = frozenset({"model", "messages", "prompt", "tools", "return_token_ids"})
PROMPT_MADE_PARAM = "trajlake_prompt"
"""Key in ``llm.request`` params, under token sessions: ``{"made": "stitched"}`` or
``{"made": "engine_rendered", "fallback": <reason>}``."""


@dataclass
class CapturedCall:
    """Everything the hot path learned about one call; parsed and validated later."""

    kind: Kind
    tenant: str
    rollout: RolloutIdentity
    call: CallIdentity
    request: dict[str, Any]
    received_ns: int
    finished_ns: int
    upstream_retries: int
    completion: Completion | None = None
    raw_response: bytes | None = None
    """Unparsed upstream body, when the hot path had no reason to parse it."""
    error: str | None = None
    engine_headers: dict[str, str] = field(default_factory=dict)
    """Response headers of the engine; ``x-policy-version``, ``x-tokenizer``, ``x-chat-template-hash`` are recorded."""
    prompt_made: dict[str, str] | None = None
    """Under token sessions: how the prompt was made (``PROMPT_MADE_PARAM`` in the request's params)."""
    previous: PreviousCall | None = None
    """Under token sessions: the rollout's last call, which this call's prompt may extend (a prefix reference)."""
    reference: Reference | None = None
    """Under token sessions, a stitched call whose prompt the engine echoed id for id: its prefix reference to
    ``previous``, known without measuring again."""
    tools_digest: bytes | None = None
    """Under token sessions: the request's tools digest (``prefix_refs.digest``), made once on the request path."""


def _parse_answer(captured: CapturedCall) -> Completion | None:
    try:
        answer = json.loads(captured.raw_response or b"")
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        captured.error = captured.error or "the upstream answered HTTP 200 with a body that is not a JSON object"
        return None
    return read_completion(captured.kind, answer)


class Recorder:
    """Builds the two events of a call; retokenizes when the engine sent no ids."""

    def __init__(self, *, policy_version: str | None, retokenizer: Retokenizer | None,
                 prefix_references: bool = True, history: SessionStore | None = None,
                 redactor: Redactor | None = None) -> None:
        self.policy_version = policy_version
        self.retokenizer = retokenizer
        self.prefix_references = prefix_references
        """Record a prompt that extends the rollout's last call as a reference to it plus the new ids."""
        self.history = history
        """Digests of each rollout's last recorded chat call's full messages, tools and answer
        (``PreviousMessages``), on this thread: a call whose messages start with them (and the harness's echo of
        the answer), or whose tools equal them, references that call and carries only its new messages (None:
        every call carries its whole messages and tools)."""
        self.redactor = redactor
        """The rules the emitter applies: a reference must not hide from them what a whole call would show them
        (``Redactor.changes_history``): an answer whose echo they change is never counted, and a call whose full
        messages or tools they change loses its prompt ids."""

    def events(self, captured: CapturedCall) -> list[Event]:
        done = captured.completion
        if done is None and captured.raw_response is not None:
            done = _parse_answer(captured)
        prompt_ids, response_ids, source = self._tokens(captured, done)
        reference = None
        previous = captured.previous
        if self.prefix_references and previous is not None and previous.call_id != captured.call.call_id \
                and source == "engine" and prompt_ids:  # (a keyed retry recorded again is not its own reference)
            # measured id by id, never assumed (a stitched call's was, against the ids the engine echoed)
            reference = captured.reference or shared_prefix(prompt_ids, previous)
        key = self._history_key(captured)
        body = captured.request
        tools = body.get("tools") if isinstance(body.get("tools"), list) else None
        digested = digests(body["messages"], tools, tools_digest=captured.tools_digest) \
            if key is not None else None  # once, for both uses below
        shared = self._messages_reference(key, captured, tools, reference, digested)
        answer = answer_message(done.text, done.tool_calls) if key is not None and done is not None \
            and not captured.error else None
        changed, echo_changed = self.redactor.changes_history(captured.tenant, body["messages"], tools, answer) \
            if self.redactor is not None and key is not None else (False, False)
        if changed and shared is not None:  # its ids encode what the rules change in messages it stores by reference
            prompt_ids, reference = None, None
        request = self._request(captured, prompt_ids, reference, shared)
        if key is not None:  # the next call may reference this one: its request is recorded
            self.history.put(key, remembered(captured.call.call_id, body["messages"], tools,
                                             answer=None if echo_changed else answer, digested=digested))
        return [request, self._response(captured, done, response_ids, source)]

    def _history_key(self, captured: CapturedCall) -> SessionKey | None:
        """Where the rollout's last chat call is remembered; None when messages references are off or not possible."""
        rollout = captured.rollout
        if self.history is None or not rollout.attached or not isinstance(captured.request.get("messages"), list):
            return None
        return captured.tenant, rollout.rollout_id, rollout.attempt, rollout.span_id

    def _messages_reference(self, key: SessionKey | None, captured: CapturedCall, tools: list[dict] | None,
                            reference: Reference | None, digested: Digests | None) -> MessagesReference | None:
        """The rollout's last chat call's messages and tools this call shares (compared exactly). None when it
        shares none, when its prompt ids reference another call, or when the last call is this one (a keyed
        retry recorded again)."""
        previous = self.history.get(key) if key is not None else None
        if previous is None or previous.call_id == captured.call.call_id:
            return None
        shared = shared_messages(captured.request["messages"], tools, previous, digested=digested)
        if shared is None or (reference is not None and reference.extends_call_id != shared.extends_call_id):
            return None  # one call is referenced: the prompt ids' reference wins (rare: a session older than this)
        return shared

    def _tokens(self, captured: CapturedCall, done: Completion | None) -> tuple[list | None, list | None, str]:
        if done is None:
            return None, None, "none"
        if done.response_token_ids is not None:
            return done.prompt_token_ids, done.response_token_ids, "engine"
        if self.retokenizer is None:
            return None, None, "none"
        body = captured.request
        prompt_ids = self.retokenizer.prompt_ids(
            messages=body.get("messages"), prompt=body.get("prompt"), tools=body.get("tools")
        )
        return prompt_ids, self.retokenizer.response_ids(done.text), "retokenized"

    def _envelope(self, captured: CapturedCall, *, kind: str, seq: int, ts_ns: int, stable: bool) -> dict[str, Any]:
        rollout, call = captured.rollout, captured.call
        key = call.idempotency_key
        event_id = stable_id(captured.tenant, key, call.fingerprint or "", kind) if (stable and key) else uuid7()
        return dict(
            event_id=event_id,
            type=kind,
            schema_version=SCHEMA_VERSION,
            ts=datetime.fromtimestamp(ts_ns / 1e9, tz=timezone.utc),
            tenant=captured.tenant,
            task_id=rollout.task_id,
            rollout_id=rollout.rollout_id,
            attempt=rollout.attempt,
            seq=seq,
            span_id=rollout.span_id,
            parent_span_id=rollout.parent_span_id,
            harness=rollout.harness,
        )

    @staticmethod
    def _params(captured: CapturedCall) -> dict[str, Any]:
        params = {k: v for k, v in captured.request.items() if k not in _NOT_PARAMS}
        if captured.prompt_made is not None:
            params[PROMPT_MADE_PARAM] = captured.prompt_made
        return params

    def _request(self, captured: CapturedCall, prompt_ids: list | None, reference: Reference | None,
                 shared: MessagesReference | None) -> LlmRequestEvent:
        body = captured.request
        retok = self.retokenizer
        extends: dict[str, Any] = {}
        messages, tools = body.get("messages"), body.get("tools")
        if reference is not None:
            prompt_ids = reference.new_ids
            extends = dict(extends_call_id=reference.extends_call_id, extends_tokens=reference.extends_tokens)
        elif isinstance(prompt_ids, array):  # a stitched call's ids (token sessions), not referenced
            prompt_ids = prompt_ids.tolist()
        if shared is not None:
            extends.update(extends_call_id=shared.extends_call_id, extends_messages=shared.extends_messages,
                           extends_tools=True if shared.extends_tools else None)
            messages, tools = shared.new_messages, None if shared.extends_tools else tools
        payload = LlmRequest(
            call_id=captured.call.call_id,
            model=body.get("model") if isinstance(body.get("model"), str) else None,
            messages=messages,
            prompt=body.get("prompt") if isinstance(body.get("prompt"), str) else None,
            tools=tools,
            params=self._params(captured),
            prompt_token_ids=prompt_ids,
            tokenizer=retok.identity if retok else captured.engine_headers.get("x-tokenizer"),
            chat_template_hash=retok.template_hash if retok else captured.engine_headers.get("x-chat-template-hash"),
            idempotency_key=captured.call.idempotency_key,
            **extends,
        )
        seq = captured.received_ns // 1000
        envelope = self._envelope(captured, kind="llm.request", seq=seq, ts_ns=captured.received_ns, stable=True)
        return LlmRequestEvent(**envelope, payload=payload)

    def _response(
        self, captured: CapturedCall, done: Completion | None, response_ids: list | None, source: str
    ) -> LlmResponseEvent:
        done = done or Completion()
        logprobs = done.logprobs
        if logprobs is not None and (response_ids is None or len(logprobs) != len(response_ids)):
            log.warning("logprobs do not match tokens call_id=%s: logprobs not recorded", captured.call.call_id)
            logprobs = None
        elif logprobs is not None and not all(type(v) in (int, float) and math.isfinite(v) for v in logprobs):
            # the contract takes finite numbers only; the call is still recorded, without them
            log.warning("logprobs that are not finite numbers call_id=%s: logprobs not recorded", captured.call.call_id)
            logprobs = None
        payload = LlmResponse(
            call_id=captured.call.call_id,
            text=done.text,
            tool_calls=done.tool_calls,
            finish_reason=done.finish_reason,
            response_token_ids=response_ids,
            logprobs=logprobs,
            token_source=source,
            usage=done.usage,
            latency_ms=(captured.finished_ns - captured.received_ns) / 1e6,
            upstream_retries=captured.upstream_retries,
            policy_version=self.policy_version or captured.engine_headers.get("x-policy-version") or done.model,
            error=captured.error,
        )
        seq = max(captured.finished_ns // 1000, captured.received_ns // 1000 + 1)
        envelope = self._envelope(
            captured, kind="llm.response", seq=seq, ts_ns=captured.finished_ns, stable=captured.error is None
        )
        return LlmResponseEvent(**envelope, payload=payload)
