"""The assistant message that a call's answer becomes in the next call's messages (the harness's echo).

A messages reference may count the referenced call's answer
(``extends_messages`` = its full messages + 1; ``schemas/EVENTS.md``): the
message after its full messages is then rebuilt from its ``llm.response``
in one fixed layout, the one the official ``openai`` Python client sends back
(``message.model_dump(exclude_none=True)``): ``content`` (left out when
null), ``role``, ``tool_calls`` (left out when none; each ``id``,
``function`` {``arguments``, ``name``}, ``type``). A producer counts the
answer only when the echoed message is this one exactly (the same JSON
text, keys in this order): any other layout, a null ``content`` sent as
``null``, an edited answer, goes in full, as sent.

>>> answer_message("4", None)
{'content': '4', 'role': 'assistant'}
>>> answer_message(None, [{"id": "c1", "type": "function", "function": {"name": "add", "arguments": "{}"}}])
{'role': 'assistant', 'tool_calls': [{'id': 'c1', 'function': {'arguments': '{}', 'name': 'add'}, 'type': 'function'}]}
"""

from __future__ import annotations

from typing import Any


def answer_message(text: str | None, tool_calls: list[Any] | None) -> dict[str, Any] | None:
    """The echo of an answer with this ``text`` and these ``tool_calls`` (as ``llm.response`` records them); None
    when it has no such layout (a tool call without a string ``id``, ``type``, ``function.name`` or
    ``function.arguments``): such an answer is never counted by a reference."""
    message: dict[str, Any] = {} if text is None else {"content": text}
    message["role"] = "assistant"
    if tool_calls:
        calls = []
        for call in tool_calls:
            function = call.get("function") if isinstance(call, dict) else None
            fields = (call.get("id"), call.get("type"), *(function.get(k) for k in ("arguments", "name"))) \
                if isinstance(function, dict) else (None,)
            if not all(isinstance(f, str) for f in fields):
                return None
            call_id, kind, arguments, name = fields
            calls.append({"id": call_id, "function": {"arguments": arguments, "name": name}, "type": kind})
        message["tool_calls"] = calls
    return message
