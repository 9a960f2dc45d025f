"""The proxy service: forward a completion call, answer the client, record it off the hot path."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from ingest.gateway.capture import CapturedCall, Recorder
from ingest.gateway.emitter import Emitter
from ingest.gateway.errors import GatewayError, UpstreamFailure
from ingest.gateway.http1 import Reply
from ingest.gateway.idempotency import IdempotencyCache, StoredReply
from ingest.gateway.identity import CallIdentity, RolloutIdentity
from ingest.gateway.metrics import GatewayMetrics
from ingest.gateway.sessions.answer import ChatAnswer, without_echo
from ingest.gateway.sessions.stitch import Plan, Stitcher
from ingest.gateway.tokens import Asked, Completion, Kind, StreamAccumulator, asked_by, read_completion, strip, \
    upstream_body
from ingest.gateway.upstream import Upstream, UpstreamReply
from ingest.prefix_refs import PreviousCall

log = logging.getLogger(__name__)

UPSTREAM_PATHS: dict[Kind, str] = {"chat": "/chat/completions", "completions": "/completions"}
_JSON = "application/json"
_SSE = "text/event-stream"


@dataclass(frozen=True)
class Answer:
    """A whole answer to send back."""

    status: int
    body: bytes
    content_type: str = _JSON
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class StreamAnswer:
    """An SSE answer, relayed chunk by chunk."""

    chunks: AsyncIterator[bytes]


@dataclass
class _Call:
    """One in-progress call: what the client sent and who it belongs to."""

    kind: Kind
    body: dict[str, Any]
    tenant: str
    rollout: RolloutIdentity
    call: CallIdentity
    asked: Asked
    received_ns: int = field(default_factory=time.time_ns)
    retries: int = 0
    plan: Plan | None = None
    """How the prompt of a chat call is made, when token sessions are on."""
    answer: ChatAnswer | None = None
    """Builds the chat answer of a stitched call from the engine's completion."""

    def captured(self, **outcome: Any) -> CapturedCall:
        return CapturedCall(
            kind=self.kind, tenant=self.tenant, rollout=self.rollout, call=self.call, request=self.body,
            received_ns=self.received_ns, finished_ns=time.time_ns(), upstream_retries=self.retries,
            prompt_made=self.plan.record() if self.plan else None, previous=_previous_call(self.plan),
            reference=self.plan.reference() if self.plan else None,
            tools_digest=self.plan.tools_digest if self.plan else None, **outcome,
        )

    @property
    def upstream_kind(self) -> Kind:
        return "completions" if self.answer is not None else self.kind


def _previous_call(plan: Plan | None) -> PreviousCall | None:
    """The rollout's last call as this call found it (token sessions): what its prompt may reference."""
    session = plan.previous if plan is not None else None
    if session is None or not session.call_id:
        return None
    return PreviousCall(session.call_id, session.prompt_ids, session.sampled_ids)


class ProxyService:
    """Forwards completion calls to the engine and records them through the emitter."""

    def __init__(
        self,
        *,
        upstream: Upstream,
        emitter: Emitter,
        recorder: Recorder,
        metrics: GatewayMetrics,
        idempotency: IdempotencyCache,
        request_token_ids: bool = True,
        sessions: Stitcher | None = None,
    ) -> None:
        self.request_token_ids = request_token_ids
        """False: forward bodies unchanged (engines that refuse ``return_token_ids``); ids then come from
        the configured tokenizer, or are not recorded."""
        self.upstream = upstream
        self.emitter = emitter
        self.recorder = recorder
        self.metrics = metrics
        self.idempotency = idempotency
        self.sessions = sessions
        """Token sessions (None: off): chat calls that extend the rollout's last call go out as token ids."""

    async def complete(
        self, kind: Kind, body: dict[str, Any], *, tenant: str, rollout: RolloutIdentity, call: CallIdentity
    ) -> Answer | StreamAnswer:
        """Answer one completion call (streaming when the body says so)."""
        key = call.idempotency_key
        if key is not None:
            stored = self.idempotency.begin(tenant, key, call.fingerprint or "")
            if stored is not None:
                self.metrics.idempotent_replays.inc()
                return Answer(stored.status, stored.body, stored.content_type, {"idempotent-replayed": "true"})
        current = _Call(kind, body, tenant, rollout, call, asked_by(kind, body))
        payload = self._plan(current) if kind == "chat" and self.sessions is not None else None
        if payload is None:
            forwarded = upstream_body(kind, body, current.asked) if self.request_token_ids else body
            payload = json.dumps(forwarded, separators=(",", ":")).encode()
        try:
            if body.get("stream") is True:
                return await self._stream(current, payload)
            return await self._whole(current, payload)
        except GatewayError as exc:
            if isinstance(exc, UpstreamFailure):
                current.retries = exc.retries
            self.metrics.upstream_errors.labels(exc.code or "error").inc()
            self._record(current.captured(error=exc.message))
            self._forget(current)
            raise
        except BaseException:
            self._forget(current)  # never leave a key "in flight" (every retry would get 409)
            raise

    def _plan(self, current: _Call) -> bytes | None:
        """Plan a chat call's prompt; the completions request of a stitched call, None for the plain route."""
        rollout = current.rollout
        key = (current.tenant, rollout.rollout_id, rollout.attempt, rollout.span_id) if rollout.attached else None
        plan = current.plan = self.sessions.plan(current.body, key)
        self.metrics.prompt_made(plan.made, plan.reason)
        if plan.payload is None:
            return None
        current.answer = ChatAnswer(current.body, current.asked, plan.parser, plan.packed)
        return plan.payload

    def _remember_session(self, current: _Call, done: Completion) -> None:
        if current.plan is not None and self.sessions is not None:
            self.sessions.remember(current.plan, prompt_ids=done.prompt_token_ids, sampled_ids=done.response_token_ids,
                                   content=done.text, tool_calls=done.tool_calls, call_id=current.call.call_id)

    async def models(self) -> Answer:
        """``GET /v1/models`` of the engine, passed through."""
        reply = await self.upstream.request("GET", "/models")
        return Answer(reply.status, reply.body, reply.content_type)

    async def _whole(self, current: _Call, payload: bytes) -> Answer:
        reply = await self.upstream.request("POST", UPSTREAM_PATHS[current.upstream_kind], body=payload)
        current.retries = reply.retries
        if reply.status != 200:
            return self._upstream_failed(current, reply.status, reply.body, reply.content_type)
        if current.plan is not None:
            return await self._whole_session(current, reply)
        body = reply.body
        if not current.asked.everything:
            try:
                answer = json.loads(body)
            except ValueError:
                answer = None  # passed through as is; the recorder notes the bad JSON
            if isinstance(answer, dict) and strip(current.kind, answer, current.asked):
                body = json.dumps(answer, separators=(",", ":"), ensure_ascii=False).encode()
        await self._record_durably(current.captured(raw_response=reply.body, engine_headers=reply.headers))
        self._remember(current, StoredReply(200, body, _JSON))
        return Answer(200, body)

    async def _whole_session(self, current: _Call, reply: UpstreamReply) -> Answer:
        """A chat answer under token sessions: parsed on the hot path, so the next call can extend it."""
        raw = reply.body
        if current.answer is not None:  # a stitched call: its prompt's echo is compared as bytes when it can be
            raw = without_echo(raw, current.plan.prompt_json) or raw
        try:
            answer = json.loads(raw)
        except ValueError:
            answer = None
        if not isinstance(answer, dict):
            await self._record_durably(current.captured(raw_response=reply.body, engine_headers=reply.headers))
            self._remember(current, StoredReply(200, reply.body, _JSON))
            return Answer(200, reply.body)
        body = reply.body
        if current.answer is not None:
            answer = current.answer.whole(answer)
            done = current.answer.record
            body = json.dumps(answer, separators=(",", ":"), ensure_ascii=False).encode()
        else:
            done = read_completion("chat", answer)
            if not current.asked.everything and strip("chat", answer, current.asked):
                body = json.dumps(answer, separators=(",", ":"), ensure_ascii=False).encode()
        self._remember_session(current, done)
        await self._record_durably(current.captured(completion=done, engine_headers=reply.headers))
        self._remember(current, StoredReply(200, body, _JSON))
        return Answer(200, body)

    async def _stream(self, current: _Call, payload: bytes) -> Answer | StreamAnswer:
        response, current.retries = await self.upstream.open_stream(UPSTREAM_PATHS[current.upstream_kind],
                                                                    body=payload)
        if response.status != 200:
            try:
                body = await response.read()
            except (TimeoutError, ConnectionError) as exc:
                body = f"(error body unreadable: {exc!r})".encode()
            finally:
                await response.aclose()
            return self._upstream_failed(current, response.status, body, response.headers.get("content-type", _JSON))
        return StreamAnswer(self._relay(current, response))

    async def _relay(self, current: _Call, response: Reply) -> AsyncIterator[bytes]:
        """Relay the engine's SSE events. The call is complete once the engine sent ``[DONE]`` (or ended its
        stream): a client that closes the connection after reading ``[DONE]`` (the openai client does, before
        the engine's end of stream arrives) does not make it an error."""
        acc = StreamAccumulator(current.upstream_kind)
        sent: list[bytes] = []
        keep = current.call.idempotency_key is not None  # the stream is stored for replays of keyed calls
        error: str | None = "client disconnected before the stream ended"
        buffer = b""
        try:
            async for data in response.iter_bytes():
                buffer += data
                while (end := buffer.find(b"\n\n")) >= 0:
                    event, buffer = buffer[: end + 2], buffer[end + 2:]
                    out, done = self._relay_event(event, acc, current)
                    if done and error is not None:
                        self._remember_session(current, self._streamed(current, acc))
                    if keep:
                        sent.append(out)
                    if done:
                        error = None
                    yield out
            if buffer.strip():
                sent.append(buffer)
                yield buffer
            error = None
        except (TimeoutError, ConnectionError) as exc:
            if error is not None:  # after [DONE] the answer is whole: a late break changes nothing
                error = f"upstream stream broke: {exc!r}"
                self.metrics.upstream_errors.labels("stream_broken").inc()
                yield _sse_error(error)
        finally:
            # Record before awaiting anything: a cancelled task (client gone) may be cancelled again at any await.
            self._record(current.captured(completion=self._streamed(current, acc), error=error,
                                          engine_headers=response.headers))
            self._remember(current, StoredReply(200, b"".join(sent), _SSE) if error is None else None)
            await response.aclose()

    @staticmethod
    def _streamed(current: _Call, acc: StreamAccumulator) -> Completion:
        """What a streamed call answered (a stitched call: as the client got it, in chat terms)."""
        return current.answer.record if current.answer is not None else acc.result()

    def _relay_event(self, event: bytes, acc: StreamAccumulator, current: _Call) -> tuple[bytes, bool]:
        """The event as the client gets it, and whether it was the engine's ``[DONE]``."""
        asked = current.asked
        lines = event.split(b"\n")
        changed = done = False
        for i, line in enumerate(lines):
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                done = True
                continue
            try:
                chunk = json.loads(data)
            except ValueError:
                continue  # relayed untouched; not ours to judge
            if not isinstance(chunk, dict):
                continue
            acc.feed(chunk)
            if current.answer is not None:
                lines[i] = b"\n\n".join(b"data: " + json.dumps(c, separators=(",", ":"), ensure_ascii=False).encode()
                                         for c in current.answer.chunks(chunk))
                changed = True
            elif not asked.everything and strip(acc.kind, chunk, asked):
                lines[i] = b"data: " + json.dumps(chunk, separators=(",", ":"), ensure_ascii=False).encode()
                changed = True
        return (b"\n".join(lines) if changed else event), done

    def _upstream_failed(self, current: _Call, status: int, body: bytes, content_type: str) -> Answer:
        """The engine answered an error: pass it through unchanged, record it, let a retry run."""
        self.metrics.upstream_errors.labels(f"http_{status}").inc()
        detail = body[:500].decode("utf-8", "replace")
        self._record(current.captured(error=f"upstream answered HTTP {status}: {detail}"))
        self._forget(current)
        return Answer(status, body, content_type)

    def _record(self, captured: CapturedCall) -> None:
        self.emitter.submit(partial(self.recorder.events, captured))

    async def _record_durably(self, captured: CapturedCall) -> None:
        """Record the call and wait until its events are acknowledged by Kafka or fsynced to the spool.

        Answering before that would leave the events of an answered call only in memory (the emitter's
        linger plus one acknowledgement, up to ``broker_timeout_s`` while the broker is slow): a gateway
        killed then lost them (the mixed-fault soak, tests/soak, saw it). The answer goes out either way:
        events that could not be kept (spool full) are counted and logged by the emitter.
        """
        loop = asyncio.get_running_loop()
        durable: asyncio.Future[bool] = loop.create_future()

        def settle(ok: bool) -> None:
            if not durable.done():  # the client may have gone (task cancelled) meanwhile
                durable.set_result(ok)

        self.emitter.submit(partial(self.recorder.events, captured),
                            on_durable=lambda ok: loop.call_soon_threadsafe(settle, ok))
        await durable

    def _remember(self, current: _Call, reply: StoredReply | None) -> None:
        call = current.call
        if call.idempotency_key is not None:
            self.idempotency.finish(current.tenant, call.idempotency_key, call.fingerprint or "", reply)

    def _forget(self, current: _Call) -> None:
        self._remember(current, None)


def _sse_error(message: str) -> bytes:
    """An SSE chunk that OpenAI clients raise as an APIError."""
    error = {"error": {"message": message, "type": "upstream_error", "code": "stream_broken"}}
    return b"data: " + json.dumps(error).encode() + b"\n\n"
