"""References for producers: send a call as "what an earlier call had + what is new".

Prompt ids (``shared_prefix``): "the ids of an earlier call + these new ids".
Messages and tools (``shared_messages``): "the first k messages of an earlier
call + these new messages", "that call's tools".

A producer that knows the rollout's previous call (its call_id, prompt ids and
sampled response ids) compares them with the next prompt, id by id, and
sends only what follows the shared prefix (``schemas/EVENTS.md``, prefix
references). Nothing is assumed: the shared length is measured, so a prompt
that diverges inside the previous answer (re-tokenized history, a template
that rewrites earlier turns) still references the part that matches, and one
that shares nothing goes out whole. The gateway (token sessions) and the SDK
(``prefix_references=True``) both use this.

>>> shared_prefix([1, 2, 3, 4, 9], PreviousCall("c1", [1, 2], [3, 4]))
Reference(extends_call_id='c1', extends_tokens=4, new_ids=[9])

Messages are compared exactly, each by the digest of its JSON text (keys in
the order sent, numbers as parsed: ``1`` and ``1.0`` and ``true`` differ): a
message the harness echoes with any change, even a reordered key, ends the
shared run there, so the full list always rebuilds JSON-equal to what was
sent. The harness's echo of the earlier call's answer counts too, when it
is exactly the message that answer rebuilds to (``schemas.answer_message``:
the layout the official ``openai`` client sends back): ``extends_messages``
is then one more than that call's messages; an echo in any other layout is
new, stored as sent.

>>> from schemas.answer_message import answer_message
>>> first = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]
>>> before = remembered("c1", first, None, answer=answer_message("4", None))
>>> shared_messages([*first, {"content": "4", "role": "assistant"}], None, before).extends_messages
3
>>> shared_messages([*first, {"role": "assistant", "content": "4"}], None, before).extends_messages
2
"""

from __future__ import annotations

from collections.abc import Sequence
import hashlib
import json
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class PreviousCall:
    """What the next call of a rollout may extend: the call and its ids as they were recorded."""

    call_id: str
    prompt_ids: Sequence[int]
    response_ids: Sequence[int]


@dataclass(frozen=True)
class Reference:
    """The payload fields of a prefix reference."""

    extends_call_id: str
    extends_tokens: int
    new_ids: list[int]


def shared_prefix(prompt_ids: Sequence[int], previous: PreviousCall) -> Reference | None:
    """The reference for ``prompt_ids`` against ``previous``; None when they share no leading id."""
    prompt = np.asarray(prompt_ids, dtype=np.int64)
    before = np.concatenate([np.asarray(previous.prompt_ids, dtype=np.int64),
                             np.asarray(previous.response_ids, dtype=np.int64)])
    n = min(len(prompt), len(before))
    differ = np.flatnonzero(prompt[:n] != before[:n])
    shared = int(differ[0]) if len(differ) else n
    if shared == 0:
        return None
    return Reference(previous.call_id, shared, prompt[shared:].tolist())


@dataclass(frozen=True)
class PreviousMessages:
    """What the next call of a rollout may reference of an earlier call: digests of its full messages and tools."""

    call_id: str
    messages: tuple[bytes, ...]
    tools: bytes | None
    answer: bytes | None = None
    """Digest of the message the call's answer rebuilds to (``schemas.answer_message``); None: not countable."""

    @property
    def nbytes(self) -> int:
        """About what it holds in memory (a ``SessionStore`` bounds entries by this)."""
        return 250 + len(self.call_id) + 60 * (len(self.messages) + 1)  # a 16-byte digest is a 49-byte object


@dataclass(frozen=True)
class MessagesReference:
    """The payload fields of a messages (and tools) reference."""

    extends_call_id: str
    extends_messages: int | None
    """How many leading messages are shared (the answer, when echoed, counting as the one after that call's
    messages); None when only the tools are."""
    new_messages: list[dict[str, Any]] | None
    """The messages after the shared ones (the call's whole list when none are shared)."""
    extends_tools: bool


def digest(value: Any) -> bytes:
    """The 16-byte digest of a JSON value's exact text (keys in order) that messages and tools are compared by."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return hashlib.blake2b(text.encode(), digest_size=16).digest()


@dataclass(frozen=True)
class Digests:
    """Digests of one call's full messages and tools, made once (``digests``) when a caller both compares the
    call with the previous one and remembers it."""

    messages: tuple[bytes, ...]
    tools: bytes | None


def digests(messages: list[dict[str, Any]] | None, tools: list[dict[str, Any]] | None, *,
            tools_digest: bytes | None = None) -> Digests:
    """``tools_digest``: the tools' ``digest``, when already made (the gateway's token sessions make it)."""
    if tools is not None and tools_digest is None:
        tools_digest = digest(tools)
    return Digests(tuple(digest(m) for m in messages or ()), tools_digest if tools is not None else None)


def remembered(call_id: str, messages: list[dict[str, Any]] | None, tools: list[dict[str, Any]] | None, *,
               answer: dict[str, Any] | None = None, digested: Digests | None = None) -> PreviousMessages:
    """What to keep of a call (its FULL messages and tools, and the message its recorded answer rebuilds to,
    ``schemas.answer_message``; None for a failed call) for the next call's reference. ``digested``: the
    call's ``digests``, when already made."""
    made = digested or digests(messages, tools)
    return PreviousMessages(call_id, made.messages, made.tools, None if answer is None else digest(answer))


def shared_messages(messages: list[dict[str, Any]] | None, tools: list[dict[str, Any]] | None,
                    previous: PreviousMessages, *, digested: Digests | None = None) -> MessagesReference | None:
    """The reference of a call with these full ``messages`` and ``tools`` against ``previous``; None when it
    shares neither a leading message nor its tools. ``digested``: the call's ``digests``, when already made
    (without them, messages are digested only as far as they match)."""
    mine = digested.messages if digested is not None else (digest(m) for m in messages or ())
    shared = 0
    for theirs, ours in zip(previous.messages, mine):
        if ours != theirs:
            break
        shared += 1
    if shared == len(previous.messages) and previous.answer is not None and messages and len(messages) > shared:
        echo = digested.messages[shared] if digested is not None else digest(messages[shared])
        if echo == previous.answer:
            shared += 1  # the harness's echo of the answer, exactly as it rebuilds
    tools_digest = digested.tools if digested is not None else (None if tools is None else digest(tools))
    same_tools = tools is not None and previous.tools is not None and tools_digest == previous.tools
    if shared == 0 and not same_tools:
        return None
    return MessagesReference(previous.call_id, shared or None, messages[shared:] if shared else messages, same_tools)
