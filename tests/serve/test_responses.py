"""Response assembly from generation steps: tool calls, token ids, logprobs, stream == whole."""

from __future__ import annotations

import json

import pytest
from transformers import AutoTokenizer

from serve.engine import Step
from serve.protocol import ChatRequest, CompletionRequest, parse_request
from serve.responses import ChatCompletion, TextCompletion
from serve.sampling import SampledToken
from serve.text import IncrementalText, TokenStrings

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
CALL_TEXT = 'Checking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def _steps(tokenizer, text: str, *, finish: str = "stop", end_token: bool = True) -> list[Step]:
    """Steps as the engine makes them for a model that generated ``text`` (then <|im_end|>)."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    if end_token:
        ids.append(tokenizer.convert_tokens_to_ids("<|im_end|>"))
    incremental, steps = IncrementalText(tokenizer), []
    for i, token_id in enumerate(ids):
        offset, delta = len(incremental.text), incremental.push(token_id)
        token = SampledToken(token_id, -0.5 - i, ((token_id, -0.5 - i), (7, -3.0)))
        last = i == len(ids) - 1
        steps.append(Step(token, delta + (incremental.finish() if last else ""), offset,
                          finish if last else None, ids[-1] if last and end_token else None))
    return steps


def _chat(tokenizer, steps, **fields) -> ChatCompletion:
    request, _ = parse_request(json.dumps({"messages": [{"role": "user", "content": "w?"}], **fields}).encode(),
                               ChatRequest)
    return ChatCompletion(request, [1, 2, 3], TokenStrings(tokenizer), "tiny")


def _streamed(builder, steps) -> list[dict]:
    return [*builder.opening(), *(builder.chunk(s) for s in steps), *builder.closing()]


def test_tool_call_becomes_tool_calls_with_content_outside(tokenizer):
    steps = _steps(tokenizer, CALL_TEXT)
    body = _chat(tokenizer, steps, tools=TOOLS, return_token_ids=True).response(steps)
    [choice] = body["choices"]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] == "Checking."  # stripped: the template adds the newline back
    [call] = choice["message"]["tool_calls"]
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    assert choice["token_ids"] == [s.token.token_id for s in steps]
    assert tokenizer.decode(choice["token_ids"], skip_special_tokens=True) == CALL_TEXT
    assert body["prompt_token_ids"] == [1, 2, 3]
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": len(steps), "total_tokens": 3 + len(steps)}


def test_streamed_tool_call_matches_the_whole_response(tokenizer):
    steps = _steps(tokenizer, CALL_TEXT)
    chunks = _streamed(_chat(tokenizer, steps, tools=TOOLS, return_token_ids=True, stream=True,
                             stream_options={"include_usage": True}), steps)
    assert chunks[0]["prompt_token_ids"] == [1, 2, 3] and chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    token_chunks = chunks[1:-1]
    assert [t for c in token_chunks for t in c["choices"][0]["token_ids"]] == [s.token.token_id for s in steps]
    assert "".join(c["choices"][0]["delta"]["content"] for c in token_chunks) == "Checking."
    last = token_chunks[-1]["choices"][0]
    assert last["finish_reason"] == "tool_calls"
    assert [c["function"]["name"] for c in last["delta"]["tool_calls"]] == ["get_weather"]
    assert last["delta"]["tool_calls"][0]["index"] == 0
    assert all(c["choices"][0]["finish_reason"] is None for c in token_chunks[:-1])
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == len(steps)


def test_without_tools_or_with_tool_choice_none_the_markup_stays_text(tokenizer):
    steps = _steps(tokenizer, CALL_TEXT)
    for fields in ({}, {"tools": TOOLS, "tool_choice": "none"}):
        choice = _chat(tokenizer, steps, **fields).response(steps)["choices"][0]
        assert choice["message"] == {"role": "assistant", "content": CALL_TEXT, "tool_calls": []}
        assert choice["finish_reason"] == "stop" and "token_ids" not in choice


def test_a_call_cut_by_the_length_limit_stays_length(tokenizer):
    steps = _steps(tokenizer, 'I will\n<tool_call>\n{"name": "get_weather", "argu', finish="length", end_token=False)
    choice = _chat(tokenizer, steps, tools=TOOLS).response(steps)["choices"][0]
    assert choice["finish_reason"] == "length" and choice["message"]["tool_calls"] == []
    assert choice["message"]["content"].endswith('"argu')


def test_chat_logprobs_one_entry_per_token_with_bytes(tokenizer):
    steps = _steps(tokenizer, "naïve")
    content = _chat(tokenizer, steps, logprobs=True, top_logprobs=2).response(steps)["choices"][0]["logprobs"]["content"]
    assert len(content) == len(steps)
    assert [e["logprob"] for e in content] == [s.token.logprob for s in steps]
    assert b"".join(bytes(e["bytes"]) for e in content) == "naïve".encode() + b"<|im_end|>"
    assert [t["logprob"] for t in content[0]["top_logprobs"]] == [-0.5, -3.0]


def test_completion_response_and_chunks_carry_ids_and_legacy_logprobs(tokenizer):
    steps = _steps(tokenizer, "def f(x):", end_token=False, finish="length")
    request, _ = parse_request(b'{"prompt": [5, 6], "logprobs": 1, "return_token_ids": true}', CompletionRequest)
    builder = TextCompletion(request, [5, 6], TokenStrings(tokenizer), "tiny")
    [choice] = builder.response(steps)["choices"]
    assert choice["text"] == "def f(x):" and choice["finish_reason"] == "length"
    assert choice["prompt_token_ids"] == [5, 6] and choice["token_ids"] == [s.token.token_id for s in steps]
    logprobs = choice["logprobs"]
    assert "".join(logprobs["tokens"]) == "def f(x):"
    assert logprobs["text_offset"][0] == 0 and logprobs["text_offset"] == sorted(logprobs["text_offset"])
    assert all(logprobs["tokens"][i] in top for i, top in enumerate(logprobs["top_logprobs"]))
    chunks = [builder.chunk(s) for s in steps]
    assert "prompt_token_ids" in chunks[0]["choices"][0]
    assert all("prompt_token_ids" not in c["choices"][0] for c in chunks[1:])
    assert "".join(c["choices"][0]["text"] for c in chunks) == choice["text"]
    assert builder.closing() == []
