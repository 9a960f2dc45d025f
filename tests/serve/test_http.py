"""serve-model over real HTTP (uvicorn on a free port) with the official openai client and httpx."""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
from transformers import AutoTokenizer

from schemas.tokenizer_identity import chat_template_hash, tokenizer_identity
from serve.app import create_serve_app
from serve.deps import MAX_BODY_BYTES
from trajlake.background import serve_in_thread

CAP = 48
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21°C"},
    {"role": "user", "content": "And so?"},
]


@pytest.fixture(scope="module")
def base_url(tiny_model_dir) -> Iterator[str]:
    app = create_serve_app(tiny_model_dir, served_name="tiny", policy_version="policy-3", max_new_tokens_cap=CAP)
    with serve_in_thread(app, name="serve-model") as url:
        yield url


@pytest.fixture(scope="module")
def client(base_url) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def _chat(client, *, stream: bool, **options):
    return client.chat.completions.create(
        model="tiny", messages=MESSAGES, tools=TOOLS, max_tokens=16, seed=5, logprobs=True, top_logprobs=2,
        stream=stream, extra_body={"return_token_ids": True}, **options,
    )


def test_models_and_headers_tell_the_served_identity(client, base_url, tokenizer, tiny_model_dir):
    assert [m.id for m in client.models.list()] == ["tiny"]
    response = httpx.get(base_url + "/v1/models")
    [entry] = response.json()["data"]
    assert entry["policy_version"] == "policy-3"
    assert entry["tokenizer"] == tokenizer_identity(tiny_model_dir) == response.headers["x-tokenizer"]
    assert entry["chat_template_hash"] == chat_template_hash(tokenizer.chat_template)
    assert response.headers["x-chat-template-hash"] == entry["chat_template_hash"]
    assert response.headers["x-policy-version"] == "policy-3"
    assert httpx.get(base_url + "/health").json() == {"status": "ok", "model": "tiny"}


def test_chat_returns_prompt_ids_of_the_template_and_matching_ids_text_logprobs(client, tokenizer):
    completion = _chat(client, stream=False)
    expected_prompt = tokenizer.apply_chat_template(MESSAGES, tools=TOOLS, add_generation_prompt=True,
                                                    return_dict=False)
    assert completion.prompt_token_ids == expected_prompt
    [choice] = completion.choices
    ids = choice.token_ids
    assert tokenizer.decode(ids, skip_special_tokens=True) == (choice.message.content or "")
    assert len(choice.logprobs.content) == len(ids) == completion.usage.completion_tokens
    assert completion.usage.prompt_tokens == len(expected_prompt)
    assert all(len(entry.top_logprobs) == 2 for entry in choice.logprobs.content)
    assert choice.finish_reason in {"stop", "length"} and completion.model == "tiny"


def test_streamed_chat_equals_the_non_streamed_one_for_the_same_seed(client):
    whole = _chat(client, stream=False)
    chunks = list(_chat(client, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].prompt_token_ids == whole.prompt_token_ids
    token_chunks = [c for c in chunks[1:] if c.choices]
    ids = [t for c in token_chunks for t in c.choices[0].token_ids]
    assert ids == whole.choices[0].token_ids
    assert "".join(c.choices[0].delta.content or "" for c in token_chunks) == (whole.choices[0].message.content or "")
    streamed_logprobs = [e.logprob for c in token_chunks for e in c.choices[0].logprobs.content]
    assert streamed_logprobs == [e.logprob for e in whole.choices[0].logprobs.content]
    assert token_chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason
    assert chunks[-1].usage.model_dump() == whole.usage.model_dump()


def test_completions_from_text_or_token_ids_stream_or_not_agree(client, tokenizer):
    options = {"model": "tiny", "max_tokens": 12, "seed": 11, "logprobs": 2, "extra_body": {"return_token_ids": True}}
    by_text = client.completions.create(prompt="def parse(line):\n", **options)
    [choice] = by_text.choices
    assert choice.prompt_token_ids == tokenizer.encode("def parse(line):\n")
    assert tokenizer.decode(choice.token_ids, skip_special_tokens=True) == choice.text
    assert len(choice.logprobs.token_logprobs) == len(choice.token_ids) == by_text.usage.completion_tokens
    by_ids = client.completions.create(prompt=choice.prompt_token_ids, **options)
    assert by_ids.choices[0].token_ids == choice.token_ids
    chunks = list(client.completions.create(prompt=choice.prompt_token_ids, stream=True, **options))
    assert chunks[0].choices[0].prompt_token_ids == choice.prompt_token_ids
    assert [t for c in chunks for t in c.choices[0].token_ids] == choice.token_ids
    assert "".join(c.choices[0].text for c in chunks) == choice.text
    assert [lp for c in chunks for lp in c.choices[0].logprobs.token_logprobs] == choice.logprobs.token_logprobs
    assert chunks[-1].choices[0].finish_reason == choice.finish_reason


def test_greedy_is_deterministic_and_a_stop_string_cuts_the_text(client):
    options = {"model": "tiny", "prompt": "import os\n", "max_tokens": 24, "temperature": 0,
               "extra_body": {"return_token_ids": True}}
    full = client.completions.create(**options).choices[0]
    assert client.completions.create(**options).choices[0].token_ids == full.token_ids
    assert full.finish_reason == "length"
    stop = next(full.text[i : i + 2] for i in range(4, len(full.text)) if full.text[i : i + 2].strip())
    cut = client.completions.create(stop=[stop], **options).choices[0]
    assert cut.text == full.text[: full.text.index(stop)]
    assert (cut.finish_reason, cut.stop_reason) == ("stop", stop)
    assert cut.token_ids == full.token_ids[: len(cut.token_ids)]
    streamed = list(client.completions.create(stop=[stop], stream=True, **options))
    assert "".join(c.choices[0].text for c in streamed) == cut.text
    assert streamed[-1].choices[0].finish_reason == "stop"
    token = full.token_ids[5]
    options["extra_body"] = {**options["extra_body"], "stop_token_ids": [token]}
    by_id = client.completions.create(**options).choices[0]
    assert by_id.token_ids == full.token_ids[: full.token_ids.index(token) + 1]
    assert (by_id.finish_reason, by_id.stop_reason) == ("stop", token)


def _chat_body(**fields) -> dict:
    return {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, **fields}


@pytest.mark.parametrize(
    ("path", "body", "status", "param"),
    [
        ("/v1/chat/completions", b"{not json", 400, None),
        ("/v1/chat/completions", b"[1, 2]", 400, None),
        ("/v1/chat/completions", {"model": "tiny"}, 400, "messages"),
        ("/v1/chat/completions", _chat_body(messages=[{"role": "user", "content": ["x"]}]), 400, "messages.0.content"),
        ("/v1/chat/completions", _chat_body(temperature="hot"), 400, "temperature"),
        ("/v1/chat/completions", _chat_body(model="gpt-9"), 404, "model"),
        ("/v1/chat/completions", _chat_body(n=3), 400, "n"),
        ("/v1/chat/completions", _chat_body(max_tokens=CAP + 1), 400, "max_tokens"),
        ("/v1/completions", {"prompt": list(range(2048)), "max_tokens": 1}, 400, "prompt"),
        ("/v1/completions", {"prompt": list(range(2040)), "max_tokens": 20}, 400, "max_tokens"),
        ("/v1/completions", {"prompt": [1, 99999]}, 400, "prompt"),
        ("/v1/completions", {"prompt": [1, -1]}, 400, "prompt"),
        ("/v1/completions", {"prompt": "x", "echo": True}, 400, "echo"),
    ],
)
def test_bad_requests_get_openai_errors_and_nothing_crashes(base_url, path, body, status, param):
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    response = httpx.post(base_url + path, content=content, headers={"content-type": "application/json"})
    assert response.status_code == status
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert error["param"] == param
    assert response.headers["x-policy-version"] == "policy-3"
    assert httpx.get(base_url + "/health").status_code == 200


def test_oversized_unknown_and_wrong_method_requests(base_url):
    big = httpx.post(base_url + "/v1/completions", content=b"x" * (MAX_BODY_BYTES + 1))
    assert big.status_code == 413 and big.json()["error"]["code"] == "request_too_large"
    missing = httpx.get(base_url + "/v1/nothing")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"
    assert httpx.get(base_url + "/v1/chat/completions").status_code == 405


def test_the_openai_client_sees_typed_errors(client):
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="other", messages=[{"role": "user", "content": "x"}])
    with pytest.raises(openai.BadRequestError, match="n=1"):
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], n=2)


def test_a_client_leaving_mid_stream_frees_the_model_for_the_next(base_url, client):
    body = _chat_body(max_tokens=CAP, stream=True)
    with httpx.stream("POST", base_url + "/v1/chat/completions", json=body) as response:
        assert next(response.iter_lines()).startswith("data: ")
    after = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], max_tokens=3)
    assert after.usage.completion_tokens >= 1


def test_concurrent_requests_each_get_their_own_seeded_answer(client):
    def run(seed: int) -> list[int]:
        return client.completions.create(model="tiny", prompt="x = ", max_tokens=8, seed=seed,
                                          extra_body={"return_token_ids": True}).choices[0].token_ids

    alone = [run(seed) for seed in (1, 2, 3)]
    with ThreadPoolExecutor(3) as pool:
        assert list(pool.map(run, (1, 2, 3))) == alone
    assert alone[0] != alone[1]
