"""Messages references: digests made once per call give the same references as digesting on the fly."""

from __future__ import annotations

import time

import pytest

import ingest.prefix_refs as prefix_refs
from ingest.gateway.capture import CapturedCall, Recorder
from ingest.gateway.identity import CallIdentity, RolloutIdentity
from ingest.gateway.sessions.state import SessionStore
from ingest.prefix_refs import digests, remembered, shared_messages
from schemas.answer_message import answer_message

SYSTEM = {"role": "system", "content": "Be brief."}
ASK = {"role": "user", "content": "2+2?"}
TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
ECHO = answer_message("4", None)


@pytest.mark.parametrize("messages, tools", [
    ([SYSTEM, ASK, ECHO, {"role": "user", "content": "and 3+3?"}], TOOLS),  # extends, answer echoed, same tools
    ([SYSTEM, {"content": "2+2?", "role": "user"}], TOOLS),  # a reordered key ends the shared run
    ([{"role": "system", "content": "Other."}], None),  # shares nothing
    ([SYSTEM, ASK], [*TOOLS, *TOOLS]),  # same messages, other tools
    ([], TOOLS),  # tools only
])
def test_precomputed_digests_give_the_same_reference_and_memory(messages, tools):
    before = remembered("c1", [SYSTEM, ASK], TOOLS, answer=ECHO)
    made = digests(messages, tools)
    assert shared_messages(messages, tools, before, digested=made) == shared_messages(messages, tools, before)
    assert remembered("c2", messages, tools, answer=ECHO, digested=made) == remembered("c2", messages, tools,
                                                                                       answer=ECHO)


def test_the_recorder_digests_each_message_and_the_tools_once_per_call(monkeypatch):
    recorder = Recorder(policy_version="p", retokenizer=None, history=SessionStore(max_bytes=1 << 20, ttl_s=60))
    rollout = RolloutIdentity(task_id="t", rollout_id="r", attempt=0, harness=None, span_id=None,
                              parent_span_id=None, attached=True)

    def captured(n: int, messages: list[dict]) -> CapturedCall:
        now = time.time_ns()
        return CapturedCall(kind="chat", tenant="acme", rollout=rollout, call=CallIdentity(f"call-{n}", None),
                            request={"model": "m", "messages": messages, "tools": TOOLS}, received_ns=now,
                            finished_ns=now + 1000, upstream_retries=0,
                            raw_response=b'{"choices":[{"message":{"role":"assistant","content":"4"},'
                                         b'"finish_reason":"stop"}]}')

    recorder.events(captured(1, [SYSTEM, ASK]))
    digested: list[object] = []
    real = prefix_refs.digest
    monkeypatch.setattr(prefix_refs, "digest", lambda value: digested.append(value) or real(value))
    second = [SYSTEM, ASK, ECHO, {"role": "user", "content": "and 3+3?"}]
    request, _ = recorder.events(captured(2, second))
    assert request.payload.extends_messages == 3 and request.payload.extends_tools
    answer = answer_message("4", None)
    assert sorted(map(repr, digested)) == sorted(map(repr, [*second, TOOLS, answer]))  # the answer: remembered
    digested.clear()  # the tools digested on the request path (token sessions) are not digested again
    third = [*second, ECHO, {"role": "user", "content": "and 4+4?"}]
    later = captured(3, third)
    later.tools_digest = real(TOOLS)
    request, _ = recorder.events(later)
    assert request.payload.extends_tools and sorted(map(repr, digested)) == sorted(map(repr, [*third, answer]))
