"""Decide how a chat call's prompt is made, and build the token-id prompt when it extends the last call.

A call is **stitched** when its messages are the previous call's messages, then
the assistant message the gateway returned (compared structurally: text, and
tool calls by name and parsed arguments), then at least one new message, with
the same model and tools. Its prompt is the previous prompt ids + the ids the
engine sampled + the chat template's rendering of only what follows: the
bridge after the assistant turn (e.g. ``\\n`` after ``<|im_end|>``, or
``<|im_end|>\\n`` when the answer was cut at ``max_tokens``), the new messages,
the generation prompt. The template must be prefix-preserving for that step;
templates that rewrite history (e.g. strip earlier reasoning) fail the check
and the call is **engine_rendered**, with the reason.

What a call costs (issue 13; bench/session_latency, 30-turn tool rollouts):
rendering a whole conversation through Jinja grows with its length and was
~90% of planning (4.3 ms p50 per call, two to three renders); two window
renders still were ~0.6 of 0.96 ms. Now (0.2-0.45 ms by load, the request's JSON included):

- **History compare.** The earlier messages are compared byte for byte (a
  digest of their ``marshal``, ~3x cheaper than their ``repr``) with what the
  client sent last time; only the answer and the new messages get structural
  digests. A harness that re-serialises its history differently (same
  meaning) takes the slow path: every message's structural digest, as before.
- **Render a window.** The template renders a short conversation: the first
  message, the last user message, the message before the answer, the answer,
  the new messages; the bridge and the new turns come from that. Whether the
  window renders the new turns exactly as the whole conversation does, and
  whether the template is prefix-preserving, is checked on the whole
  conversation (rendered with and without the new messages, and the history
  without the answer) once per **shape**: the model and tools, whether the
  answer ended its turn, the kind (role and filled fields) of each window
  message and where the window skips, the kinds of every message of the
  conversation, and the parity of the answer's position. A new shape is always
  checked in full; a shape that failed is checked again on every call; one
  whose window renders otherwise is always rendered whole. A rollout's first
  stitched call has a shape too (its window is the whole conversation): it
  rendered three times on every rollout before.
- **Fill, do not render.** A checked shape also keeps its new turns as a
  ``skeleton`` (the template's text around the new messages' text, found by
  rendering the window once with sentinels in their place); its next calls
  join that text with theirs, and render only when a text holds a literal the
  template tests (``skeleton``), so only the new text is encoded.
- **Ids stay arrays.** The stitched prompt is joined as an ``array`` and sent
  as JSON gathered from a table of id texts (``IdsJson``); the engine's echo
  is compared as the bytes sent (``answer.without_echo``), so the prefix
  reference is known (``Plan.reference``) and no list of ~2k ints is made,
  dumped or parsed per call.

The window assumes a template renders the new turns from the roles and fields
of the history, not from the text of messages outside the window; a template
that does (beyond the kinds above) may be checked on one rollout and differ on
another. Templates of the Qwen, Llama 3 and Mistral families do not.
"""

from __future__ import annotations

import hashlib
import json
import logging
import marshal
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ingest.gateway.sessions import skeleton
from ingest.gateway.sessions.skeleton import Skeleton
from ingest.gateway.sessions.state import DIGEST_BYTES, Session, SessionKey, SessionStore, pack_ids
from ingest.otlp.messages import loose_json
from ingest.prefix_refs import Reference, digest
from schemas.tool_parsers import ToolParser, resolve_parser

log = logging.getLogger(__name__)

FALLBACK_REASONS = (
    "unattached", "first_call", "no_session", "history_changed", "context_changed", "multimodal",
    "unsupported_params", "unknown_parser", "template_not_prefix", "template_error",
)
"""Why a call went the plain chat route. ``no_session``: the history has an assistant turn but this gateway holds
no state for the rollout (restart, another replica, evicted); ``context_changed``: another model or other tools."""

_PASSED = frozenset({
    "model", "max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "stop", "stop_token_ids",
    "presence_penalty", "frequency_penalty", "repetition_penalty", "logit_bias", "n", "stream", "stream_options",
    "ignore_eos", "min_tokens",
})
"""Chat parameters that mean the same on the completions route."""
_HANDLED = frozenset({
    "messages", "tools", "tool_choice", "max_completion_tokens", "logprobs", "top_logprobs", "return_token_ids",
    "response_format", "parallel_tool_calls", "user", "metadata", "store", "service_tier",
})
"""Chat parameters mapped or dropped below; any other parameter sends the call the plain route."""


_SHAPES_MAX = 4096
"""Checked shapes kept per stitcher (a few per agent loop); past it the cache starts over and shapes are rechecked."""


class _Multimodal(Exception):
    pass


@dataclass
class Plan:
    """How one chat call's prompt is made; what to remember of it afterwards."""

    made: str
    """``stitched`` or ``engine_rendered``."""
    reason: str | None = None
    """The fallback reason of an engine-rendered call."""
    key: SessionKey | None = None
    digests: bytes = b""
    """Structural digests of this call's messages (``message_digest``), joined."""
    raw: bytes = b""
    """Digest of this call's messages as the client sent them: what the next call compares its history with first."""
    kinds: frozenset = frozenset()
    """The kinds of this call's messages (``_kind``)."""
    context: bytes = b""
    tools_digest: bytes | None = None
    """Digest of the request's tools as sent (``prefix_refs.digest``; None: no tools), made once per call: the
    context's cache key here, the tools reference of the recorded event later."""
    packed: array | None = None
    """The prompt ids of a stitched call, as the session keeps them: kept when the engine saw exactly these."""
    payload: bytes | None = None
    """The completions request of a stitched call, as JSON (its ids joined from ``IdsJson``, not dumped)."""
    prompt_json: bytes = b""
    """The stitched prompt's ids as they are in ``payload`` (``1,2,3``): the engine's echo is looked for as sent."""
    extends: int = 0
    """How many leading ids of a stitched prompt are the previous call's prompt and sampled ids."""
    parser: ToolParser | None = None
    """Parses the raw completion of a stitched call; None: the whole text is content."""
    previous: Session | None = None
    """The rollout's last call as this call found it: what its recorded prompt may reference."""
    echoed: bool = False
    """The engine's prompt ids were exactly ``packed`` (``Stitcher.remember``): the prefix reference is known."""

    @property
    def prompt_ids(self) -> list[int]:
        """The prompt ids of a stitched call (a list made on demand; the hot path keeps ``packed``)."""
        return self.packed.tolist() if self.packed is not None else []

    def reference(self) -> Reference | None:
        """The prefix reference of a stitched call the engine saw exactly: the previous call's prompt and sampled
        ids + the new ones (compared id by id in ``remember``); None otherwise (the recorder measures it)."""
        if not self.echoed or self.previous is None or not self.previous.call_id or self.packed is None:
            return None
        return Reference(self.previous.call_id, self.extends, self.packed[self.extends:].tolist())

    def record(self) -> dict[str, str]:
        """What the ``llm.request`` event says about how its prompt was made."""
        return {"made": self.made, **({"fallback": self.reason} if self.reason else {})}


def message_digest(message: dict[str, Any]) -> bytes:
    """A digest of what a message means to the template: role, text, tool calls (name, parsed arguments), ids."""
    core = (message.get("role"), _text(message.get("content")), message.get("tool_call_id"), message.get("name"))
    digest = hashlib.sha1(repr(core).encode())  # JSON values: repr is exact and cheaper than a canonical dump
    calls = message.get("tool_calls")
    if calls:  # arguments by meaning: parsed, keys sorted
        parsed = []
        for call in calls:
            function = (call or {}).get("function") or {}
            parsed.append([function.get("name"), loose_json(function.get("arguments"))])
        digest.update(json.dumps(parsed, sort_keys=True, ensure_ascii=False).encode())
    return digest.digest()


def _text(content: Any) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in content):
        return "".join(str(p.get("text") or "") for p in content)
    raise _Multimodal


def _raw(messages: list[dict], known: int) -> tuple[bytes, bytes]:
    """Digests of the first ``known`` messages and of all of them, as sent.

    A message's bytes are its ``marshal`` (version 2: no references, so the bytes depend on the values alone):
    exact for JSON values (``1``, ``1.0`` and ``true`` differ, keys in order) and ~3x cheaper than ``repr``.
    The digests hash the list's items without its 5-byte header, so the whole list's is the head's continued.
    """
    digest = hashlib.sha1(memoryview(marshal.dumps(messages[:known], 2))[5:])
    head = digest.digest()
    digest.update(memoryview(marshal.dumps(messages[known:], 2))[5:])
    return head, digest.digest()


def _joined(prompt: array, sampled: array, suffix: list[int]) -> array:
    """The previous prompt, its sampled ids and the new ids as one array (``pack_ids``' type): a copy of memory,
    not a list of ints packed again."""
    try:
        if prompt.typecode == sampled.typecode:
            return prompt + sampled + array(prompt.typecode, suffix)
    except OverflowError:  # a new id past the 2-byte type
        pass
    return pack_ids([*prompt, *sampled, *suffix])


def _same_ids(packed: array, ids: Sequence[int]) -> bool:
    """Whether ``ids`` are exactly the ids of ``packed`` (packed alike and compared as memory, not as ints)."""
    if ids is packed:
        return True
    if len(packed) != len(ids):
        return False
    try:
        return array(packed.typecode, ids) == packed
    except (OverflowError, TypeError):  # an id the array cannot hold (or not an int): not these ids
        return False


def _kind(message: dict[str, Any]) -> tuple:
    """What of a message may change how a template renders around it: its role, each other field it holds and
    whether that is ``None``, ``""``, ``[]`` or filled (``is defined``, ``is none`` and truth tell them apart),
    its number of tool calls."""
    fields = tuple(sorted((k, v if v is None or v == "" else "[]" if v == [] else 1)
                          for k, v in message.items() if k != "role"))
    return message.get("role"), fields, len(message.get("tool_calls") or ())


def _window(messages: list[dict], answer: int) -> list[int]:
    """The messages a window renders: the first, the last user message before the answer, the one before the
    answer, the answer (at index ``answer``), the new ones."""
    user = next((n for n in range(answer - 1, 0, -1) if messages[n].get("role") == "user"), 0)
    return sorted({0, user, answer - 1}) + list(range(answer, len(messages)))


class IdsJson:
    """Token ids -> the JSON text of their list's items (``1,2,3``), gathered from a table of each id's text.

    A prompt of ~2k ids is sent on every stitched call: taking the rows of a fixed-width table (``id,`` padded
    with NULs: ``take``, ~4x cheaper than fancy indexing) and deleting the padding from their bytes
    (``bytes.translate``, ~4x cheaper than a boolean mask) takes ~0.15x ``json.dumps`` of the list (2k ids),
    and needs no list of ints (the prompt stays an ``array``). The table covers
    every 2-byte id when the vocabulary fits in them, so ``array('H')`` prompts need no bounds check."""

    def __init__(self, vocabulary: int) -> None:
        rows = 1 << 16 if vocabulary <= 1 << 16 else vocabulary
        width = len(str(rows - 1)) + 1
        texts = b"".join(f"{n},".encode().ljust(width, b"\0") for n in range(rows))
        self._table = np.frombuffer(texts, dtype=np.uint8).reshape(rows, width)

    def __call__(self, ids: array) -> bytes:
        if not ids:
            return b""
        index = np.frombuffer(ids, dtype=ids.typecode)
        if ids.typecode != "H" and (index.min() < 0 or index.max() >= len(self._table)):
            return ",".join(map(str, ids)).encode()  # an id past the tokenizer's length: spelled out
        return self._table.take(index, axis=0).tobytes().translate(None, b"\0")[:-1]


def completion_payload(body: dict[str, Any], prompt_json: bytes) -> bytes | None:
    """``completion_body`` as the JSON request, the prompt's ids already JSON (``IdsJson``); None when a parameter
    cannot be mapped."""
    params = completion_body(body, [])
    if params is None:
        return None
    del params["prompt"]  # what is left always holds return_token_ids: never empty
    return b'{"prompt":[' + prompt_json + b"]," + json.dumps(params, separators=(",", ":")).encode()[1:]


def completion_body(body: dict[str, Any], prompt_ids: list[int]) -> dict[str, Any] | None:
    """The engine's ``/completions`` request for a chat request; None when a parameter cannot be mapped."""
    unknown = set(body) - _PASSED - _HANDLED
    if unknown or body.get("n", 1) != 1 or body.get("tool_choice") not in (None, "auto", "none"):
        return None
    if body.get("response_format") not in (None, {"type": "text"}):
        return None
    out = {k: v for k, v in body.items() if k in _PASSED}
    if body.get("max_completion_tokens") is not None:
        out["max_tokens"] = body["max_completion_tokens"]
    top = body.get("top_logprobs") if body.get("logprobs") is True else None
    out.update(prompt=prompt_ids, return_token_ids=True, logprobs=top or 0)
    return out


class Stitcher:
    """Plans each chat call of a rollout and remembers what the next one must extend."""

    def __init__(self, tokenizer: Any, store: SessionStore, *, parser: str = "auto") -> None:
        self.tokenizer = tokenizer
        self.store = store
        template = getattr(tokenizer, "chat_template", None)
        self.parser = resolve_parser(parser, template if isinstance(template, str) else None)
        self.end = tokenizer.eos_token
        """The string that ends an assistant turn in the template (``<|im_end|>`` in ChatML)."""
        self._shapes: dict[tuple, bool | Skeleton] = {}
        """Shapes checked on a whole conversation: True when their window renders the new turns exactly, a
        ``Skeleton`` when moreover the new turns are the template's text around the new messages' text."""
        self._literals = skeleton.Literals(template)
        self._contexts: dict[tuple, bytes] = {}
        """(model, digest of the tools as sent) -> digest of both by meaning."""
        self._ids_json = IdsJson(len(tokenizer))
        self._backend = getattr(tokenizer, "backend_tokenizer", None) if getattr(tokenizer, "is_fast", False) else None
        """The Rust tokenizer of a fast one (looked up once: an attribute of the wrapper costs ~10 us)."""
        self._kinds: dict[frozenset, frozenset] = {}
        """Message-kind sets, one object each, shared by the sessions that hold them."""

    def plan(self, body: dict[str, Any], key: SessionKey | None) -> Plan:
        messages = body.get("messages") or []
        session = self.store.get(key) if key is not None else None
        try:
            plan = self._compare(messages, session)
        except _Multimodal:
            return Plan("engine_rendered", "multimodal")
        plan.key = key
        plan.tools_digest, plan.context = self._context(body)
        if key is None:
            plan.reason = "unattached"
            return plan
        plan.previous = session
        plan.reason = self._mismatch(session, plan)
        if plan.reason is not None:
            return plan
        parses = bool(body.get("tools")) and body.get("tool_choice") != "none"
        if parses and self.parser is None:
            plan.reason = "unknown_parser"
            return plan
        suffix = self._suffix(session, messages, body.get("tools"), plan)
        if suffix is None:
            return plan
        packed = _joined(session.prompt_ids, session.sampled_ids, suffix)
        prompt_json = self._ids_json(packed)
        payload = completion_payload(body, prompt_json)
        if payload is None:
            plan.reason = "unsupported_params"
            return plan
        plan.made, plan.reason, plan.packed, plan.payload = "stitched", None, packed, payload
        plan.prompt_json = prompt_json
        plan.extends = len(session.prompt_ids) + len(session.sampled_ids)
        plan.parser = self.parser if parses else None
        return plan

    def _compare(self, messages: list[dict], session: Session | None) -> Plan:
        """This call's digests; messages the client sent last time byte for byte take the session's."""
        known = session.count - 1 if session is not None else 0  # the previous call's messages
        head, raw = _raw(messages, known)
        if session is not None and 0 < known < len(messages) and head == session.raw:
            digests = session.messages[: len(session.messages) - DIGEST_BYTES]
            digests += b"".join(message_digest(m) for m in messages[known:])
            kinds = session.kinds.union(_kind(m) for m in messages[known:])
        else:
            digests = b"".join(message_digest(m) for m in messages)
            kinds = frozenset(_kind(m) for m in messages)
        if len(self._kinds) >= _SHAPES_MAX:
            self._kinds.clear()
        return Plan("engine_rendered", digests=digests, raw=raw, kinds=self._kinds.setdefault(kinds, kinds))

    def _context(self, body: dict[str, Any]) -> tuple[bytes | None, bytes]:
        """The tools' digest as sent (``prefix_refs.digest``, the one hash of them per call) and the digest of the
        model and tools by meaning (keys sorted), cached by the first."""
        tools = body.get("tools")
        sent = digest(tools) if isinstance(tools, list) else None
        key = (body.get("model"), sent if sent is not None else repr(tools))
        found = self._contexts.get(key)
        if found is None:
            if len(self._contexts) >= _SHAPES_MAX:
                self._contexts.clear()
            found = self._contexts[key] = hashlib.sha1(json.dumps(
                [body.get("model"), tools], sort_keys=True, ensure_ascii=False).encode()).digest()
        return sent, found

    @staticmethod
    def _mismatch(session: Session | None, plan: Plan) -> str | None:
        if session is None:
            return "no_session" if any(kind[0] == "assistant" for kind in plan.kinds) else "first_call"
        if session.context != plan.context:
            return "context_changed"
        known = len(session.messages)
        if len(plan.digests) <= known or plan.digests[:known] != session.messages:
            return "history_changed"
        return None

    def _suffix(self, session: Session, messages: list[dict], tools: list | None, plan: Plan) -> list[int] | None:
        """Ids of the bridge, the new messages and the generation prompt; None (reason set) when unsafe."""
        k = session.count - 1  # the assistant message the gateway returned
        sampled_end = bool(session.sampled_ids) and self._ends_turn(session.sampled_ids[-1])
        window = _window(messages, k)
        shape = (plan.context, sampled_end, k % 2, plan.kinds,
                 tuple((_kind(messages[n]), n - before > 1) for before, n in zip([-1, *window], window)))
        windowed = self._shapes.get(shape)
        text = None
        if isinstance(windowed, Skeleton):
            before = [messages[n] for n in window if n <= k]
            text = skeleton.fill(windowed, messages[k + 1:], self._literals, before=before)
        if text is None and windowed:
            text = self._try_tail([messages[n] for n in window], window.index(k), tools, sampled_end, checked=True)
            if text is None:  # the shape's window no longer renders: render whole from now on
                self._learn(shape, False)
        if text is None:
            try:
                text = self._tail(messages, k, tools, sampled_end, checked=False)
            except Exception as exc:  # any template failure: the engine will say what is wrong
                log.debug("event=session_template_error error=%r", exc)
                plan.reason = "template_error"
                return None
            if text is None:
                plan.reason = "template_not_prefix"
                return None
            if windowed is None:
                conversation = [messages[n] for n in window]
                answer = window.index(k)
                window_text = text if len(window) == len(messages) else \
                    self._try_tail(conversation, answer, tools, sampled_end, checked=False)
                self._learn(shape, window_text == text and (
                    self._skeleton(conversation, answer, tools, sampled_end, text) or True))
        return self._encode(text)

    def _skeleton(self, window: list[dict], answer: int, tools: list | None, sampled_end: bool,
                  text: str) -> Skeleton | None:
        """The window's tail with the new messages' text as slots, when filling it back gives ``text``."""
        if not self._literals.usable:
            return None
        blank = skeleton.with_sentinels(window[answer + 1:])
        if blank is None:
            return None
        new, signatures = blank
        before = window[: answer + 1]
        rendered = self._try_tail([*before, *new], answer, tools, sampled_end, checked=True)
        found = skeleton.build(rendered, signatures) if rendered is not None else None
        if found is None or skeleton.fill(found, window[answer + 1:], self._literals, before=before) != text:
            return None
        # shapes are shared by rollouts: a tail that shows or branches on an earlier message's text gets no skeleton
        if self._try_tail([*skeleton.masked(before), *new], answer, tools, sampled_end, checked=True) != rendered:
            return None
        return found

    def _tail(self, conversation: list[dict], answer: int, tools: list | None, sampled_end: bool, *,
              checked: bool) -> str | None:
        """The text after the answer's sampled ids (the bridge, the new turns, the generation prompt); None when the
        template does not preserve the prefix. ``checked``: the shape passed the history check, skip it."""
        with_answer = self._render(conversation[: answer + 1], tools, generation=False)
        full = self._render(conversation, tools, generation=True)
        start = 0
        if not checked:
            before = self._render(conversation[:answer], tools, generation=True)
            if not with_answer.startswith(before):
                return None
            start = len(before)
        end = with_answer.rfind(self.end, start) if self.end else -1
        if end < 0 or not full.startswith(with_answer):
            return None
        bridge = with_answer[end + len(self.end):] if sampled_end else with_answer[end:]
        return bridge + full[len(with_answer):]

    def _try_tail(self, conversation: list[dict], answer: int, tools: list | None, sampled_end: bool, *,
                  checked: bool) -> str | None:
        """``_tail`` of a window; None when the window does not render (the whole conversation decides)."""
        try:
            return self._tail(conversation, answer, tools, sampled_end, checked=checked)
        except Exception as exc:
            log.debug("event=session_window_error error=%r", exc)
            return None

    def _learn(self, shape: tuple, windowed: bool | Skeleton) -> None:
        if len(self._shapes) >= _SHAPES_MAX:
            self._shapes.clear()
        self._shapes[shape] = windowed

    def _encode(self, text: str) -> list[int]:
        backend = self._backend
        if backend is not None:  # the Rust tokenizer itself: the same ids without the Python wrapper's batching
            return backend.encode(text, add_special_tokens=False).ids
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def _ends_turn(self, token_id: int) -> bool:
        return self.tokenizer.convert_ids_to_tokens(int(token_id)) == self.end

    def _render(self, messages: list[dict], tools: list | None, *, generation: bool) -> str:
        return self.tokenizer.apply_chat_template(
            messages, tools=tools or None, add_generation_prompt=generation, tokenize=False
        )

    def remember(self, plan: Plan, *, prompt_ids: Sequence[int] | None, sampled_ids: list[int] | None,
                 content: str | None, tool_calls: list[dict] | None, call_id: str = "") -> None:
        """After a successful call: the next call of the rollout may extend this one."""
        if plan.key is None or not plan.digests or not prompt_ids or not sampled_ids:
            return
        answer = message_digest({"role": "assistant", "content": content, "tool_calls": tool_calls})
        plan.echoed = plan.packed is not None and _same_ids(plan.packed, prompt_ids)
        packed = plan.packed if plan.echoed else pack_ids(prompt_ids)
        self.store.put(plan.key, Session(
            messages=plan.digests + answer, context=plan.context, prompt_ids=packed,
            sampled_ids=pack_ids(sampled_ids), call_id=call_id, raw=plan.raw, kinds=plan.kinds,
        ))
