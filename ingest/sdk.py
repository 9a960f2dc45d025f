"""Harness SDK: record rollouts from Python without going through the gateway.

A ``TrajectoryClient`` owns one producer. ``client.rollout(...)`` is a context
that stamps every event with the rollout's identity (tenant, task_id,
rollout_id, attempt, span, harness), a fresh UUIDv7 ``event_id``, an RFC 3339
UTC ``ts`` and an increasing ``seq``; it emits ``rollout.started`` on enter and
``rollout.finished`` on exit (``failed`` when an exception escapes,
``cancelled`` on KeyboardInterrupt, or what ``set_status`` said). Events are
batched by the producer and flushed when a rollout ends, when the client
closes, and at interpreter exit.

``seq`` is microseconds since the Unix epoch, bumped by one when two events
share a microsecond: increasing inside a rollout, safe across processes and
restarts, and the same convention as the gateway's, so SDK events (tools,
rewards) and gateway events (LLM calls) of one rollout sort together.

>>> from ingest.sdk import Harness, TrajectoryClient
>>> client = TrajectoryClient("127.0.0.1:9092", tenant="team-a",  # doctest: +SKIP
...                           harness=Harness(name="my-agent", version="1.2.0"))
>>> with client.rollout("task-42", policy_version="ckpt-7") as r:  # doctest: +SKIP
...     r.llm_call(prompt_token_ids=[1, 2, 3], response_token_ids=[4, 5],
...                logprobs=[-0.1, -0.7], model="qwen3-8b")
...     call = r.tool_call("search", {"q": "weather"})
...     r.tool_result(call, "search", {"hits": 3}, duration_ms=41.0)
...     with r.subagent() as helper:             # own span, same rollout
...         helper.llm_call(prompt_token_ids=[9], response_token_ids=[10])
...     r.reward("correctness", 1.0, source="unit-tests")

A harness that calls a vLLM/SGLang engine directly (asking for
``return_token_ids`` and logprobs) can hand over the request body and the
answer instead: ``r.llm_call_from_response(body, answer)``. A reward that
comes after the rollout ended, even from another process:

>>> client.reward("task-42", r.rollout_id, "human", 0.5)  # doctest: +SKIP

With ``TrajectoryClient(..., prefix_references=True)`` a call whose prompt
ids start with the same span's previous call's prompt + response ids is sent
as a reference to that call plus only the new ids (compared id by id;
``schemas/EVENTS.md``, prefix references): each token of a rollout crosses
Kafka about once; likewise messages that start with the span's previous
call's messages (compared exactly, message by message) go as a reference
plus only the new messages (the echo of that call's answer counts when it
is exactly what ``schemas.answer_message`` rebuilds), and tools equal to
that call's as a reference (``extends_messages``, ``extends_tools``). Off by default: readers older than
references would see partial prompts and messages. Give it the ingester's redaction rules
(``redactor=``, ``TRAJLAKE_REDACTION_RULES``), so that a reference hides nothing from them (``ingest.redaction``).

An asyncio harness writes ``async with client.rollout(...) as r:``: the same
events, and the rollout-end flush runs in a worker thread.
>>> client.close()  # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import atexit
import hashlib
import json
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic_settings import BaseSettings, SettingsConfigDict

from ingest.ids import rfc3339, uuid7
from ingest.prefix_refs import PreviousCall, PreviousMessages, remembered, shared_messages, shared_prefix
from ingest.producer import EventProducer, encode_event
from ingest.redaction import Redactor, load_redactor
from schemas.answer_message import answer_message
from schemas.events import DEFAULT_TOPIC, Harness, RolloutStatus
from schemas.versions import SCHEMA_VERSION

log = logging.getLogger(__name__)

__all__ = ["Harness", "RolloutContext", "SdkSettings", "Span", "TrajectoryClient", "harness_identity"]

_REASON_CHARS = 500
_REQUEST_FIELDS = frozenset({"model", "messages", "prompt", "tools"})
"""Request body keys recorded as their own fields; the rest are sampling params."""


class SdkSettings(BaseSettings):
    """Client settings from TRAJLAKE_* environment variables (see ``TrajectoryClient.from_settings``)."""

    model_config = SettingsConfigDict(env_prefix="TRAJLAKE_", extra="ignore")

    bootstrap_servers: str = "127.0.0.1:9092"
    topic: str = DEFAULT_TOPIC
    tenant: str = "default"
    harness_name: str | None = None
    harness_version: str | None = None
    harness_config_hash: str | None = None
    connect_timeout_s: float = 5.0
    """How long to wait for a broker before raising BrokerUnreachable."""
    flush_timeout_s: float = 30.0
    """How long a flush (rollout end, close) waits for the broker's acknowledgement."""
    compression: str | None = None
    """gzip, snappy, lz4 or zstd; None sends uncompressed."""
    redaction_rules: Path | None = None
    """The rules file the ingester applies (TRAJLAKE_REDACTION_RULES): with ``prefix_references`` they decide what
    a reference may share."""


def harness_identity(name: str, version: str, config: Mapping[str, Any] | None = None) -> Harness:
    """A ``Harness`` whose ``config_hash`` is the SHA-256 of ``config`` as canonical JSON.

    >>> harness_identity("agent", "1.0", {"max_steps": 30}).config_hash[:15]
    'sha256:6f4bc366'
    """
    digest = None
    if config is not None:
        canonical = json.dumps(config, sort_keys=True, separators=(",", ":"), default=str)
        digest = "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()
    return Harness(name=name, version=version, config_hash=digest)


def _span_id() -> str:
    return os.urandom(8).hex()


class _Sequencer:
    """``seq`` for one rollout: microseconds since the epoch, strictly increasing.

    Stamping and sending happen under one lock, so spans used from several
    threads still reach the broker in ``seq`` order.
    """

    def __init__(self) -> None:
        self._last = -1
        self._lock = threading.Lock()

    def send(self, events: list[dict[str, Any]], send: Callable[[dict[str, Any]], None]) -> None:
        with self._lock:
            for event in events:
                seq = max(self._last + 1, time.time_ns() // 1000)
                send({**event, "seq": seq})
                self._last = seq


class Span:
    """Emits the events of one agent (the root or a sub-agent) inside a rollout."""

    def __init__(self, client: TrajectoryClient, identity: dict[str, Any], sequencer: _Sequencer,
                 *, span_id: str, parent_span_id: str | None) -> None:
        self._client = client
        self._identity = identity
        self._sequencer = sequencer
        self.span_id = span_id
        self.parent_span_id = parent_span_id
        self.llm_calls = 0
        self._children: list[Span] = []
        self._closed = False
        self._last_call: PreviousCall | None = None
        """This span's last call with engine ids: what the next prompt may reference (``prefix_references``)."""
        self._last_messages: PreviousMessages | None = None
        """This span's last chat call: what the next call's messages and tools may reference."""

    @property
    def task_id(self) -> str:
        return self._identity["task_id"]

    @property
    def rollout_id(self) -> str:
        return self._identity["rollout_id"]

    def _event(self, event_type: str, payload: dict[str, Any], *, ts_ms: int | None = None) -> dict[str, Any]:
        """An event of this span; ``seq`` is stamped when it is sent."""
        if self._closed:
            raise RuntimeError(
                f"rollout {self.rollout_id} has finished: send late rewards with client.reward(task_id, rollout_id, ...)"
            )
        return {
            "event_id": uuid7(),
            "type": event_type,
            "schema_version": SCHEMA_VERSION,
            "ts": rfc3339(ts_ms),
            **self._identity,
            "seq": None,
            "span_id": self.span_id,
            "parent_span_id": self.parent_span_id,
            "payload": payload,
        }

    def _emit(self, event_type: str, payload: dict[str, Any]) -> None:
        self._sequencer.send([self._event(event_type, payload)], self._client._send)

    def llm_call(
        self,
        *,
        prompt_token_ids: list[int] | None = None,
        response_token_ids: list[int] | None = None,
        logprobs: list[float] | None = None,
        token_source: str | None = None,
        text: str | None = None,
        model: str | None = None,
        messages: list[dict[str, Any]] | None = None,
        prompt: str | None = None,
        tools: list[dict[str, Any]] | None = None,
        params: dict[str, Any] | None = None,
        tool_calls: list[dict[str, Any]] | None = None,
        finish_reason: str | None = None,
        usage: dict[str, Any] | None = None,
        latency_ms: float | None = None,
        tokenizer: str | None = None,
        chat_template_hash: str | None = None,
        idempotency_key: str | None = None,
        policy_version: str | None = None,
        error: str | None = None,
        call_id: str | None = None,
    ) -> str:
        """Record one LLM call as an ``llm.request`` + ``llm.response`` pair; returns its call id.

        Pass the token ids exactly as the engine returned them (``return_token_ids``)
        and one logprob per response token. ``token_source`` defaults to
        "engine" when response ids are given, else "none".
        """
        call_id = call_id or uuid7()
        now_ms = time.time_ns() // 1_000_000
        sent_ms = now_ms - int(latency_ms) if latency_ms is not None and 0 <= latency_ms < now_ms else now_ms
        token_source = token_source or ("engine" if response_token_ids is not None else "none")
        stored_ids, reference = prompt_token_ids, {}
        if self._client.prefix_references and self._last_call is not None and self._last_call.call_id != call_id \
                and prompt_token_ids:
            shared = shared_prefix(prompt_token_ids, self._last_call)
            if shared is not None:
                stored_ids = shared.new_ids
                reference = {"extends_call_id": shared.extends_call_id, "extends_tokens": shared.extends_tokens}
        full_messages, full_tools = messages, tools
        last = self._last_messages
        if self._client.prefix_references and last is not None and last.call_id != call_id and messages is not None:
            same = shared_messages(messages, tools, last)
            if same is not None and reference.get("extends_call_id", same.extends_call_id) == same.extends_call_id:
                reference.update(extends_call_id=same.extends_call_id, extends_messages=same.extends_messages,
                                 extends_tools=True if same.extends_tools else None)
                messages, tools = same.new_messages, None if same.extends_tools else tools
        answer = answer_message(text, tool_calls) if error is None else None
        redactor = self._client.redactor
        changed, echo_changed = redactor.changes_history(self._identity["tenant"], full_messages, full_tools, answer) \
            if redactor is not None and self._client.prefix_references and full_messages is not None else (False, False)
        if changed and "extends_messages" in reference:  # its ids encode what the rules change in shared messages
            stored_ids = None
            reference.pop("extends_tokens", None)
        request = self._event("llm.request", {
            "call_id": call_id, "model": model, "messages": messages, "prompt": prompt, "tools": tools,
            "params": params or {}, "prompt_token_ids": stored_ids, "tokenizer": tokenizer,
            "chat_template_hash": chat_template_hash, "idempotency_key": idempotency_key, **reference,
        }, ts_ms=sent_ms)
        response = self._event("llm.response", {
            "call_id": call_id, "text": text, "tool_calls": tool_calls, "finish_reason": finish_reason,
            "response_token_ids": response_token_ids, "logprobs": logprobs,
            "token_source": token_source,
            "usage": usage, "latency_ms": latency_ms, "policy_version": policy_version, "error": error,
        }, ts_ms=now_ms)
        encode_event({**response, "seq": 0})  # refuse the pair as a whole (fields, size): never an orphan request
        self._sequencer.send([request, response], self._client._send)
        self.llm_calls += 1
        if self._client.prefix_references and error is None and token_source == "engine" and prompt_token_ids:
            self._last_call = PreviousCall(call_id, list(prompt_token_ids), list(response_token_ids or ()))
        if self._client.prefix_references and full_messages is not None:
            self._last_messages = remembered(call_id, full_messages, full_tools,
                                             answer=None if echo_changed else answer)
        return call_id

    def llm_call_from_response(
        self,
        request: Mapping[str, Any],
        response: Mapping[str, Any] | Any,
        *,
        kind: Literal["chat", "completions"] = "chat",
        latency_ms: float | None = None,
        **fields: Any,
    ) -> str:
        """Record a call made directly to a vLLM/SGLang engine from its request body and answer.

        ``response`` is the engine's JSON (or an ``openai`` response object):
        ask the engine for ``return_token_ids`` and logprobs, and the exact ids
        are taken from it (``prompt_token_ids``, ``choices[0].token_ids``).
        ``fields`` are passed on to ``llm_call`` (e.g. ``idempotency_key``).

        >>> body = {"model": "m", "messages": msgs, "extra_body": {"return_token_ids": True}}  # doctest: +SKIP
        >>> r.llm_call_from_response(body, openai_client.chat.completions.create(**body))  # doctest: +SKIP
        """
        from ingest.gateway.tokens import read_completion  # here: importing the gateway loads FastAPI

        answer = response if isinstance(response, Mapping) else response.model_dump()
        done = read_completion(kind, dict(answer))
        params = {k: v for k, v in request.items() if k not in _REQUEST_FIELDS}
        return self.llm_call(
            prompt_token_ids=done.prompt_token_ids, response_token_ids=done.response_token_ids,
            logprobs=done.logprobs, text=done.text, tool_calls=done.tool_calls, finish_reason=done.finish_reason,
            usage=done.usage, model=request.get("model", done.model), messages=request.get("messages"),
            prompt=request.get("prompt"), tools=request.get("tools"), params=params, latency_ms=latency_ms,
            **fields,
        )

    def tool_call(self, name: str, arguments: Any = None, *, call_id: str | None = None) -> str:
        """Record that the agent invoked a tool; returns the call id to pass to ``tool_result``."""
        call_id = call_id or uuid7()
        self._emit("tool.call", {"call_id": call_id, "name": name, "arguments": arguments})
        return call_id

    def tool_result(
        self,
        call_id: str,
        name: str,
        result: Any = None,
        *,
        error: str | None = None,
        duration_ms: float | None = None,
        state_changed: bool | None = None,
    ) -> None:
        """Record what a tool returned; ``state_changed`` says whether it changed the world."""
        self._emit("tool.result", {
            "call_id": call_id, "name": name, "result": result, "error": error,
            "duration_ms": duration_ms, "state_changed": state_changed,
        })

    def reward(self, name: str, value: float, *, source: str | None = None) -> None:
        """Record a scalar reward for the rollout (several names per rollout are fine)."""
        self._emit("reward", {"name": name, "value": value, "source": source})

    def subagent(self) -> Span:
        """A child span for a sub-agent: same rollout, new span_id, this span as parent."""
        child = Span(self._client, self._identity, self._sequencer,
                     span_id=_span_id(), parent_span_id=self.span_id)
        self._children.append(child)
        return child

    def _close(self) -> None:
        self._closed = True
        for child in self._children:
            child._close()

    def __enter__(self) -> Span:
        return self

    def __exit__(self, *exc: object) -> None:
        """A sub-agent span has no lifecycle events; leaving the block just ends it."""
        self._close()


class RolloutContext(Span):
    """The root span of a rollout: emits ``rollout.started`` on enter, ``rollout.finished`` on exit."""

    def __init__(self, client: TrajectoryClient, identity: dict[str, Any], *, started: dict[str, Any]) -> None:
        super().__init__(client, identity, _Sequencer(), span_id=_span_id(), parent_span_id=None)
        self._started = started
        self._status: tuple[str, str | None, int | None] | None = None

    def set_status(self, status: RolloutStatus, *, reason: str | None = None, steps: int | None = None) -> None:
        """Decide how the rollout ends (default: succeeded, or failed on an exception)."""
        self._status = (status, reason, steps)

    def __enter__(self) -> RolloutContext:
        self._emit("rollout.started", self._started)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        self._finish(exc_type, exc)
        if self._client.flush_each_rollout:
            self._client.flush()

    async def __aenter__(self) -> RolloutContext:
        return self.__enter__()  # sending only enqueues: it does not block the event loop

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        """As ``__exit__``, with the flush in a worker thread so the event loop keeps running."""
        self._finish(exc_type, exc)
        if self._client.flush_each_rollout:
            await asyncio.to_thread(self._client.flush)

    def _finish(self, exc_type: type[BaseException] | None, exc: BaseException | None) -> None:
        if self._status is not None:
            status, reason, steps = self._status
        elif exc_type is None:
            status, reason, steps = "succeeded", None, None
        else:
            # CancelledError and KeyboardInterrupt are BaseExceptions: the rollout was stopped, not broken.
            status = "failed" if issubclass(exc_type, Exception) else "cancelled"
            reason, steps = f"{exc_type.__name__}: {exc}"[:_REASON_CHARS], None
        self._emit("rollout.finished", {"status": status, "reason": reason,
                                        "steps": self.llm_calls if steps is None else steps})
        self._close()
        log.debug("rollout finished rollout_id=%s task_id=%s status=%s", self.rollout_id, self.task_id, status)


class TrajectoryClient:
    """Sends a harness's rollouts to the trajectory topic. Close it, or let atexit flush it."""

    def __init__(
        self,
        bootstrap_servers: str = "127.0.0.1:9092",
        *,
        topic: str = DEFAULT_TOPIC,
        tenant: str = "default",
        harness: Harness | None = None,
        connect_timeout_s: float = 5.0,
        compression: str | None = None,
        flush_each_rollout: bool = True,
        flush_timeout_s: float = 30.0,
        producer: EventProducer | None = None,
        prefix_references: bool = False,
        redactor: Redactor | None = None,
    ) -> None:
        self.tenant = tenant
        self.prefix_references = prefix_references
        """Send a prompt that extends the span's previous call as a reference + new ids (module doc)."""
        self.redactor = redactor
        """The ingester's redaction rules: references then hide nothing from them (``Redactor.changes_history``)."""
        self.harness = harness
        self.flush_each_rollout = flush_each_rollout
        self.flush_timeout_s = flush_timeout_s
        self.producer = producer or EventProducer(
            bootstrap_servers, topic=topic, connect_timeout_s=connect_timeout_s, compression=compression,
            client_id="trajlake-sdk",
        )
        self._closed = False
        self._atexit = _close_at_exit(weakref.ref(self))
        atexit.register(self._atexit)

    @classmethod
    def from_settings(cls, settings: SdkSettings | None = None, **overrides: Any) -> TrajectoryClient:
        """A client configured from ``SdkSettings`` (TRAJLAKE_* variables by default)."""
        settings = settings or SdkSettings()
        harness = None
        if settings.harness_name and settings.harness_version:
            harness = Harness(name=settings.harness_name, version=settings.harness_version,
                              config_hash=settings.harness_config_hash)
        options: dict[str, Any] = dict(topic=settings.topic, tenant=settings.tenant, harness=harness,
                                       connect_timeout_s=settings.connect_timeout_s,
                                       flush_timeout_s=settings.flush_timeout_s,
                                       compression=settings.compression,
                                       redactor=load_redactor(settings.redaction_rules))
        return cls(settings.bootstrap_servers, **{**options, **overrides})

    def _identity(self, task_id: str, rollout_id: str, attempt: int) -> dict[str, Any]:
        return {
            "tenant": self.tenant, "task_id": task_id, "rollout_id": rollout_id, "attempt": attempt,
            "harness": self.harness.model_dump() if self.harness else None,
        }

    def rollout(
        self,
        task_id: str,
        *,
        rollout_id: str | None = None,
        attempt: int = 0,
        group_id: str | None = None,
        policy_version: str | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> RolloutContext:
        """A context for one attempt at ``task_id``; ``rollout_id`` defaults to a new UUIDv7."""
        identity = self._identity(task_id, rollout_id or uuid7(), attempt)
        started = {"group_id": group_id, "policy_version": policy_version, "metadata": metadata or {}}
        return RolloutContext(self, identity, started=started)

    def reward(
        self,
        task_id: str,
        rollout_id: str,
        name: str,
        value: float,
        *,
        source: str | None = None,
        attempt: int = 0,
    ) -> None:
        """A reward for a rollout that may have ended long ago (or in another process)."""
        span = Span(self, self._identity(task_id, rollout_id, attempt), _Sequencer(),
                    span_id=_span_id(), parent_span_id=None)
        span.reward(name, value, source=source)

    def _send(self, event: dict[str, Any]) -> None:
        if self._closed:
            raise RuntimeError("this TrajectoryClient is closed: create a new one")
        self.producer.send(event)

    def flush(self, *, timeout_s: float | None = None) -> None:
        """Wait until every event sent so far is acknowledged (default: ``flush_timeout_s``).

        Raises ``BrokerUnreachable`` when the broker does not acknowledge in time.
        """
        self.producer.flush(timeout_s=self.flush_timeout_s if timeout_s is None else timeout_s)

    def close(self, *, timeout_s: float | None = None) -> None:
        """Flush and disconnect; safe to call twice."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self._atexit)
        self.producer.close(timeout_s=self.flush_timeout_s if timeout_s is None else timeout_s)

    def __enter__(self) -> TrajectoryClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _close_at_exit(ref: weakref.ref[TrajectoryClient]):
    """An atexit hook that closes the client if it still exists (without keeping it alive)."""

    def hook() -> None:
        client = ref()
        if client is not None:
            client.close()

    return hook
