"""Token session parts on their own: the state's bounds, the parser registry, the prompt stitching rules."""

from __future__ import annotations

import json
from array import array

import pytest

from schemas.tool_parsers import resolve_parser
from ingest.gateway.sessions.state import Session, SessionStore
from ingest.gateway.sessions.stitch import Stitcher, completion_body, message_digest


def session(tokens: int) -> Session:
    return Session(messages=b"x" * 20, context=b"c", prompt_ids=array("i", range(tokens)), sampled_ids=array("i"))


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_store_evicts_least_recently_used_beyond_its_bytes_and_idle_ones_after_the_ttl():
    clock = Clock()
    one = session(1000).nbytes
    store = SessionStore(max_bytes=int(2.5 * one), ttl_s=10, clock=clock)
    for name in "abc":
        store.put(("t", name, 0, None), session(1000))
        assert store.get(("t", "a", 0, None)) is not None  # "a" stays the most recently used
    assert store.get(("t", "b", 0, None)) is None and len(store) == 2 and store.evicted == 1
    assert store.bytes == 2 * one
    clock.now = 11
    assert store.get(("t", "a", 0, None)) is None and len(store) == 0 and store.bytes == 0
    store.put(("t", "huge", 0, None), session(10_000))  # over the whole budget: not kept
    assert len(store) == 0
    with pytest.raises(ValueError, match="session_max_bytes"):
        SessionStore(max_bytes=0, ttl_s=1)


def test_parsers_resolve_by_name_alias_or_template():
    assert resolve_parser("qwen", None).name == resolve_parser("hermes", None).name == "hermes"
    assert resolve_parser("auto", "... <tool_call> ...").name == "hermes"
    assert resolve_parser("auto", "no markup") is None and resolve_parser("mistral", None) is None
    content, calls = resolve_parser("hermes", None).parse(' Sure. <tool_call>{"name": "f", "arguments": {"a": 1}}')
    assert content == "Sure." and calls[0]["function"] == {"name": "f", "arguments": '{"a": 1}'}
    assert resolve_parser("hermes", None).parse("<tool_call>not json</tool_call>") == (
        "<tool_call>not json</tool_call>", [])


def test_messages_compare_by_meaning_not_by_serialisation():
    call = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1, "b": [2]}'}}
    respaced = {"id": "other", "function": {"name": "f", "arguments": '{"b":[2],"a":1}'}}
    sent = {"role": "assistant", "content": None, "tool_calls": [call], "refusal": None}
    assert message_digest(sent) == message_digest({"role": "assistant", "content": "", "tool_calls": [respaced]})
    assert message_digest(sent) != message_digest({"role": "assistant", "content": "", "tool_calls": []})
    parts = {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}
    assert message_digest(parts) == message_digest({"role": "user", "content": "ab"})


def test_chat_parameters_map_to_the_completions_route_or_refuse():
    body = {"model": "m", "messages": [], "max_completion_tokens": 7, "temperature": 0.5, "logprobs": True,
            "top_logprobs": 3, "tool_choice": "auto", "user": "u", "stream": True}
    assert completion_body(body, [1, 2]) == {"model": "m", "temperature": 0.5, "stream": True, "max_tokens": 7,
                                             "prompt": [1, 2], "return_token_ids": True, "logprobs": 3}
    assert completion_body({**body, "n": 2}, [1]) is None
    assert completion_body({**body, "tool_choice": "required"}, [1]) is None
    assert completion_body({**body, "response_format": {"type": "json_object"}}, [1]) is None
    assert completion_body({**body, "chat_template_kwargs": {}}, [1]) is None


def test_an_answer_cut_at_max_tokens_gets_the_end_of_turn_in_the_bridge(tiny_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    stitcher = Stitcher(tok, SessionStore(max_bytes=1 << 20, ttl_s=60))
    messages = [{"role": "user", "content": "count"}]
    key = ("t", "r", 0, None)
    prompt = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    end = tok.convert_tokens_to_ids("<|im_end|>")
    for sampled, bridge in ((tok.encode("one two"), "<|im_end|>\n"), (tok.encode("one two") + [end], "\n")):
        plan = stitcher.plan({"model": "m", "messages": messages}, key)
        stitcher.remember(plan, prompt_ids=prompt, sampled_ids=sampled, content="one two", tool_calls=None)
        follow = [*messages, {"role": "assistant", "content": "one two"}, {"role": "user", "content": "go on"}]
        plan = stitcher.plan({"model": "m", "messages": follow}, key)
        assert plan.made == "stitched", plan.reason
        assert plan.prompt_ids[: len(prompt) + len(sampled)] == [*prompt, *sampled]
        suffix = tok.decode(plan.prompt_ids[len(prompt) + len(sampled):], skip_special_tokens=False)
        assert suffix == bridge + "<|im_start|>user\ngo on<|im_end|>\n<|im_start|>assistant\n"


def test_a_raw_completion_becomes_the_chat_answer_the_client_asked_for():
    from ingest.gateway.sessions.answer import ChatAnswer
    from ingest.gateway.tokens import Asked
    from schemas.tool_parsers import PARSERS

    text = 'Sure.<tool_call>{"name": "f", "arguments": {"a": 1}}</tool_call>'
    logprobs = {"tokens": ["Sure", "."], "token_logprobs": [-0.1, -0.2], "top_logprobs": [{"Sure": -0.1}, {".": -0.2}]}
    engine = {"id": "cmpl-9", "created": 1, "model": "m", "usage": {"prompt_tokens": 3},
              "choices": [{"index": 0, "text": text, "finish_reason": "stop", "prompt_token_ids": [1, 2, 3],
                           "token_ids": [7, 8], "logprobs": logprobs}]}
    asked = Asked(token_ids=False, logprobs=True)
    answer = ChatAnswer({"top_logprobs": 1}, asked, PARSERS["hermes"], [1, 2, 3])
    chat = answer.whole(engine)
    choice = chat["choices"][0]
    assert chat["id"] == "chatcmpl-9" and chat["object"] == "chat.completion" and "prompt_token_ids" not in chat
    assert choice["message"]["content"] == "Sure." and choice["finish_reason"] == "tool_calls"
    assert choice["message"]["tool_calls"][0]["function"] == {"name": "f", "arguments": '{"a": 1}'}
    assert [e["logprob"] for e in choice["logprobs"]["content"]] == [-0.1, -0.2] and "token_ids" not in choice
    assert answer.record.response_token_ids == [7, 8] and answer.record.logprobs == [-0.1, -0.2]

    stream = ChatAnswer({}, Asked(token_ids=True, logprobs=False), PARSERS["hermes"], [1, 2, 3])
    pieces = ["Sure.", '<tool_call>{"name": "f", ', '"arguments": {"a": 1}}</tool_call>']
    chunks = []
    for n, piece in enumerate(pieces):
        chunks += stream.chunks({"id": "cmpl-9", "model": "m", "choices": [
            {"index": 0, "text": piece, "token_ids": [n], "finish_reason": "stop" if n == 2 else None}]})
    chunks += stream.chunks({"id": "cmpl-9", "model": "m", "choices": [], "usage": {"completion_tokens": 3}})
    assert stream.chunks({"error": {"message": "boom"}}) == [{"error": {"message": "boom"}}]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert chunks[0]["prompt_token_ids"] == [1, 2, 3]
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"]) == "Sure."
    last = chunks[-2]["choices"][0]
    assert last["finish_reason"] == "tool_calls" and last["delta"]["tool_calls"][0]["function"]["name"] == "f"
    assert chunks[-1] == {"id": "chatcmpl-9", "object": "chat.completion.chunk", "created": None, "model": "m",
                          "choices": [], "usage": {"completion_tokens": 3}}
    assert stream.record.response_token_ids == [0, 1, 2] and stream.record.text == "Sure."


def test_a_template_that_fails_on_the_new_turns_falls_back(tiny_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    tok.chat_template = "{% if messages | length > 2 %}{{ raise_exception('too long') }}{% endif %}" + tok.chat_template
    stitcher = Stitcher(tok, SessionStore(max_bytes=1 << 20, ttl_s=60))
    messages = [{"role": "user", "content": "count"}]
    key = ("t", "r", 0, None)
    plan = stitcher.plan({"model": "m", "messages": messages}, key)
    stitcher.remember(plan, prompt_ids=[1, 2], sampled_ids=[3], content="one", tool_calls=None)
    follow = [*messages, {"role": "assistant", "content": "one"}, {"role": "user", "content": "go on"}]
    assert stitcher.plan({"model": "m", "messages": follow}, key).reason == "template_error"


def test_a_checked_shape_renders_a_window_and_gives_the_ids_the_whole_conversation_gives(tiny_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    renders: list[int] = []
    render = tok.apply_chat_template
    tok.apply_chat_template = lambda messages, **kw: renders.append(len(messages)) or render(messages, **kw)
    store = SessionStore(max_bytes=1 << 20, ttl_s=60)
    stitcher = Stitcher(tok, store)
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    key = ("t", "r", 0, None)
    end = tok.convert_tokens_to_ids("<|im_end|>")

    def call(messages: list[dict], n: int) -> tuple:
        renders.clear()
        plan = stitcher.plan({"model": "m", "messages": messages, "tools": tools}, key)
        text = f'<tool_call>\n{{"name": "f", "arguments": {{"a": {n}}}}}\n</tool_call>'
        content, calls = stitcher.parser.parse(text)
        stitcher.remember(plan, prompt_ids=plan.prompt_ids or [1, 2], sampled_ids=tok.encode(text) + [end],
                          content=content, tool_calls=calls)
        answer = {"role": "assistant", "content": content, "tool_calls": calls}
        return plan, [*messages, answer, {"role": "tool", "tool_call_id": calls[0]["id"], "content": str(n)}]

    plan, messages = call([{"role": "user", "content": "add"}], 1)
    assert plan.reason == "first_call" and renders == []
    plan, messages = call(messages, 2)
    # The window is the whole conversation: checked on it (3 renders), then its skeleton (sentinels, masked: 4).
    assert plan.made == "stitched" and len(renders) == 7
    plan, messages = call(messages, 3)
    # A new shape: the whole conversation, its window, the window with the new text as sentinels (the skeleton),
    # and once more with the earlier messages' text masked (a skeleton must not depend on it).
    assert plan.made == "stitched" and renders[:3] == [4, 5, 3] and len(renders) == 10
    kept = store.get(key)
    plan, _ = call(messages, 4)
    assert plan.made == "stitched" and renders == []  # checked shape: its skeleton filled with the new text
    store.put(key, kept)
    whole = Stitcher(tok, store).plan({"model": "m", "messages": messages, "tools": tools}, key)
    assert whole.made == "stitched" and whole.prompt_ids == plan.prompt_ids

    # The same meaning, other text: the history is compared message by message, and still extends the session.
    store.put(key, kept)
    stale = [dict(m) for m in messages]
    stale[1]["tool_calls"] = [{**stale[1]["tool_calls"][0], "function": {"name": "f", "arguments": '{"a":1}'}}]
    assert message_digest(stale[1]) == message_digest(messages[1])
    plan, _ = call(stale, 4)
    assert plan.made == "stitched" and plan.prompt_ids == whole.prompt_ids
    store.put(key, kept)
    stale[1]["tool_calls"] = [{**stale[1]["tool_calls"][0], "function": {"name": "f", "arguments": '{"a": 9}'}}]
    assert call(stale, 4)[0].reason == "history_changed"


def test_a_new_shape_is_checked_on_the_whole_conversation_even_when_its_window_passes(tiny_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    # Rewrites the message at index 5 (outside the last call's window) once the conversation ends with a user turn.
    tok.chat_template = (
        "{%- for m in messages -%}<|im_start|>{{ m.role }}\n"
        "{%- if loop.index0 == 5 and messages[-1].role == 'user' -%}(earlier)"
        "{%- else -%}{{ m.content or '' }}{%- for c in m.tool_calls or [] -%}<tool_call>{{ c.function.name }}"
        "</tool_call>{%- endfor -%}{%- endif -%}<|im_end|>\n{%- endfor -%}"
        "{%- if add_generation_prompt -%}<|im_start|>assistant\n{%- endif -%}")
    stitcher = Stitcher(tok, SessionStore(max_bytes=1 << 20, ttl_s=60), parser="hermes")
    key = ("t", "r", 0, None)
    end = tok.convert_tokens_to_ids("<|im_end|>")
    messages: list[dict] = [{"role": "system", "content": "s"}, {"role": "user", "content": "go"}]
    made = []
    for n, new in enumerate(["tool", "tool", "tool", "tool", "user"]):
        plan = stitcher.plan({"model": "m", "messages": messages}, key)
        made.append(plan.made if plan.made == "stitched" else plan.reason)
        stitcher.remember(plan, prompt_ids=[1, 2], sampled_ids=tok.encode(f"step {n}") + [end], content=f"step {n}",
                          tool_calls=None)
        messages = [*messages, {"role": "assistant", "content": f"step {n}"}, {"role": new, "content": str(n)}]
    plan = stitcher.plan({"model": "m", "messages": messages}, key)
    assert made == ["first_call", "stitched", "stitched", "stitched", "stitched"]  # the tool turns' shapes: windowed
    assert plan.reason == "template_not_prefix"


def test_a_stitched_prompt_is_sent_as_the_json_of_its_ids():
    from ingest.gateway.sessions.stitch import IdsJson, completion_payload

    ids = IdsJson(1000)
    for packed in (array("H", [0, 7, 999, 10, 100]), array("i", [5, 1000, 70_000]), array("i", [-1, 2]), array("H")):
        assert ids(packed) == json.dumps(packed.tolist(), separators=(",", ":"))[1:-1].encode()
    body = {"model": "m", "messages": [], "max_completion_tokens": 7}
    assert json.loads(completion_payload(body, ids(array("H", [1, 2])))) == completion_body(body, [1, 2])


def test_the_engines_echo_of_a_stitched_prompt_is_compared_as_sent_or_parsed():
    from ingest.gateway.sessions.answer import without_echo

    sent = b"1,2,3"
    reply = b'{"choices":[{"text":"hi","prompt_token_ids":[1,2,3],"token_ids":[4]}]}'
    assert json.loads(without_echo(reply, sent)) == {"choices": [{"text": "hi", "prompt_token_ids": None,
                                                                  "token_ids": [4]}]}
    assert without_echo(reply.replace(b"[1,2,3]", b"[1,2,34]"), sent) is None  # other ids
    assert without_echo(reply.replace(b"[1,2,3]", b"[1, 2, 3]"), sent) is None  # spelled otherwise: parsed
    assert without_echo(reply.replace(b'"hi"', b'"hi","prompt_token_ids":[1,2,3]'), sent) is None  # twice
    assert without_echo(b'{"choices":[{"text":"\\"prompt_token_ids\\":[1,2,3]"}]}', sent) is None  # in a text


def test_the_shape_of_a_message_tells_empty_text_from_none_and_from_absent():
    from ingest.gateway.sessions.stitch import _kind

    kinds = {_kind(m) for m in ({"role": "tool"}, {"role": "tool", "content": None}, {"role": "tool", "content": ""},
                                {"role": "tool", "content": []}, {"role": "tool", "content": "x"})}
    assert len(kinds) == 5 and _kind({"role": "tool", "content": "x"}) == _kind({"content": "y", "role": "tool"})
