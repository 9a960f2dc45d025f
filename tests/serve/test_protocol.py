"""Request validation: strict types, clear 400s naming the parameter, unknown extras ignored."""

from __future__ import annotations

import json

import pytest

from serve.protocol import ChatRequest, CompletionRequest, ServeError, parse_request

USER = [{"role": "user", "content": "hi"}]


def _chat(**fields) -> bytes:
    return json.dumps({"messages": USER, **fields}).encode()


def _completion(**fields) -> bytes:
    return json.dumps({"prompt": "hi", **fields}).encode()


def _error(raw: bytes, model) -> ServeError:
    with pytest.raises(ServeError) as caught:
        parse_request(raw, model)
    assert caught.value.status == 400
    body = caught.value.body()["error"]
    assert set(body) == {"message", "type", "param", "code"} and body["type"] == "invalid_request_error"
    return caught.value


def test_a_valid_chat_request_keeps_the_raw_body_for_the_template():
    request, body = parse_request(_chat(tools=[{"function": {"name": "f"}, "type": "function"}], seed=3), ChatRequest)
    assert request.seed == 3 and request.parses_tool_calls()
    assert list(body["tools"][0]) == ["function", "type"]  # key order as sent: the prompt depends on it


def test_unknown_extra_fields_are_ignored_like_vllm():
    request, _ = parse_request(_chat(user="u1", parallel_tool_calls=True, skip_special_tokens=True), ChatRequest)
    assert request.n == 1


@pytest.mark.parametrize(
    ("raw", "param", "needle"),
    [
        (b"{not json", None, "not valid JSON"),
        (b"", None, "not valid JSON"),
        (b"\xff\xfe", None, "not valid JSON"),
        (b"[]", None, "JSON object"),
        (b'"text"', None, "JSON object"),
        (b"{}", "messages", "messages"),
        (_chat(messages=[]), "messages", "at least 1"),
        (_chat(messages="hi"), "messages", "list"),
        (_chat(messages=[{"content": "hi"}]), "messages.0.role", "Field required"),
        (_chat(messages=[{"role": "robot", "content": "hi"}]), "messages.0.role", "'user'"),
        (_chat(messages=[{"role": "user", "content": 5}]), "messages.0.content", "expected one of"),
        (_chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": "x"}]}]),
         "messages.0.content", "expected one of"),
        (_chat(temperature="0.5"), "temperature", "number"),
        (_chat(temperature=3), "temperature", "less than or equal"),
        (_chat(top_p=0), "top_p", "greater than 0"),
        (_chat(max_tokens=0), "max_tokens", "greater than or equal to 1"),
        (_chat(max_tokens=True), "max_tokens", "integer"),
        (_chat(max_tokens=2.5), "max_tokens", "integer"),
        (_chat(stream="yes"), "stream", "boolean"),
        (_chat(stop=["a"] * 17), "stop", "expected one of"),
        (_chat(stop=[""]), "stop", "expected one of"),
        (_chat(stop_token_ids=[-1]), "stop_token_ids.0", "greater than or equal to 0"),
        (_chat(stop_token_ids="2"), "stop_token_ids", "list"),
        (_chat(tools=[{"type": "function"}]), "tools.0.function", "Field required"),
        (_chat(tools=[{"type": "retrieval", "function": {"name": "f"}}]), "tools.0.type", "'function'"),
        (_chat(top_logprobs=21, logprobs=True), "top_logprobs", "less than or equal to 20"),
        (_chat(n=2), "n", "n=1"),
        (_chat(presence_penalty=0.5), "presence_penalty", "not supported"),
        (_chat(frequency_penalty=-1.0), "frequency_penalty", "not supported"),
        (_chat(logit_bias={"5": 1.0}), "logit_bias", "not supported"),
        (_chat(tool_choice="required"), "tool_choice", "'auto' or 'none'"),
        (_chat(tool_choice={"type": "function", "function": {"name": "f"}}), "tool_choice", "'auto' or 'none'"),
        (_chat(top_logprobs=2), "top_logprobs", "logprobs=true"),
        (_chat(response_format={"type": "json_object"}), "response_format", "text"),
        (_chat(stream_options={"include_usage": True}), "stream_options", "stream=true"),
    ],
)
def test_bad_chat_requests_get_a_400_naming_the_parameter(raw, param, needle):
    error = _error(raw, ChatRequest)
    assert error.param == param
    assert needle in error.message


@pytest.mark.parametrize(
    ("raw", "param", "needle"),
    [
        (b'{"max_tokens": 3}', "prompt", "Field required"),
        (_completion(prompt=True), "prompt", "expected one of"),
        (_completion(prompt=[1, "a"]), "prompt", "expected one of"),
        (_completion(prompt=[[1], [2]]), "prompt", "one prompt per request"),
        (_completion(prompt=["a", "b"]), "prompt", "one prompt per request"),
        (_completion(prompt=""), "prompt", "empty"),
        (_completion(prompt=[]), "prompt", "empty"),
        (_completion(prompt=[[]]), "prompt", "empty"),
        (_completion(logprobs=True), "logprobs", "integer"),
        (_completion(logprobs=50), "logprobs", "less than or equal to 20"),
        (_completion(echo=True), "echo", "not supported"),
        (_completion(best_of=3), "best_of", "best_of=1"),
        (_completion(suffix="x"), "suffix", "not supported"),
        (_completion(n=0), "n", "n=1"),
    ],
)
def test_bad_completion_requests_get_a_400_naming_the_parameter(raw, param, needle):
    def check() -> ServeError:
        with pytest.raises(ServeError) as caught:
            request, _ = parse_request(raw, CompletionRequest)
            request.single_prompt()
        return caught.value

    error = check()
    assert (error.status, error.param) == (400, param)
    assert needle in error.message


@pytest.mark.parametrize(
    ("prompt", "expected"), [("hi", "hi"), (["hi"], "hi"), ([1, 2], [1, 2]), ([[3, 4]], [3, 4])]
)
def test_one_prompt_as_text_or_token_ids(prompt, expected):
    request, _ = parse_request(_completion(prompt=prompt), CompletionRequest)
    assert request.single_prompt() == expected


def test_max_completion_tokens_wins_over_max_tokens():
    request, _ = parse_request(_chat(max_tokens=9, max_completion_tokens=4), ChatRequest)
    assert request.requested_max_tokens() == 4
    request, _ = parse_request(_chat(stop="x"), ChatRequest)
    assert request.stop_strings() == ("x",)
