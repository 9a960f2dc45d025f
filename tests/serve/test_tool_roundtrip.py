"""A real tool call end to end: a checkpoint trained to call a tool, served over real HTTP.

The random tiny model never writes a tool call, so the fixture fine-tunes it
(plain torch, ~50 AdamW steps) to answer one prompt with a Hermes tool call,
saves it with ``save_pretrained`` like the trainer does, and serves that
folder: the loop trainer -> checkpoint -> serve-model, with nothing faked.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import openai
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from serve.app import create_serve_app
from trajlake.background import serve_in_thread

TOOLS = [{"type": "function", "function": {"name": "get_weather"}}]
ASK = [{"role": "user", "content": "Weather in Paris?"}]
ANSWER = 'Sure.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>'


@pytest.fixture(scope="module")
def tool_calling_checkpoint(tiny_model_dir, tmp_path_factory):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    prompt = tokenizer.apply_chat_template(ASK, tools=TOOLS, add_generation_prompt=True, return_dict=False)
    target = tokenizer.encode(ANSWER, add_special_tokens=False)
    ids = torch.tensor([prompt + target])
    labels = ids.clone()
    labels[0, : len(prompt)] = -100
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for _ in range(150):
            loss = model(input_ids=ids, labels=labels).loss
            if loss.item() < 0.02:  # well below what greedy decoding needs to reproduce ANSWER
                break
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    finally:
        torch.set_num_threads(threads)
    out = tmp_path_factory.mktemp("ckpt") / "tool-caller"
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def client(tool_calling_checkpoint) -> Iterator[openai.OpenAI]:
    app = create_serve_app(tool_calling_checkpoint, policy_version="tool-caller-1", max_new_tokens_cap=64)
    with serve_in_thread(app, name="serve-model") as url:
        yield openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)


def _ask(client, **options):
    return client.chat.completions.create(
        model="tool-caller", messages=ASK, tools=TOOLS, max_tokens=48, temperature=0,
        extra_body={"return_token_ids": True}, **options,
    )


def test_the_model_tool_call_is_parsed_and_its_tokens_kept(client, tool_calling_checkpoint):
    completion = _ask(client, logprobs=True)
    [choice] = completion.choices
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Sure."
    [call] = choice.message.tool_calls
    assert (call.type, call.function.name, json.loads(call.function.arguments)) == (
        "function", "get_weather", {"city": "Paris"})
    tokenizer = AutoTokenizer.from_pretrained(tool_calling_checkpoint)
    assert tokenizer.decode(choice.token_ids) == ANSWER  # the markup is in the ids, as sampled
    assert len(choice.logprobs.content) == len(choice.token_ids)


def test_streamed_tool_call_equals_the_non_streamed_one(client):
    whole = _ask(client).choices[0]
    chunks = list(_ask(client, stream=True))
    choices = [c.choices[0] for c in chunks if c.choices]
    assert "".join(c.delta.content or "" for c in choices) == whole.message.content
    assert [t for c in choices for t in getattr(c, "token_ids", [])] == whole.token_ids
    [delta] = [tc for c in choices for tc in (c.delta.tool_calls or [])]
    assert (delta.index, delta.function.name, delta.function.arguments) == (
        0, "get_weather", whole.message.tool_calls[0].function.arguments)
    assert choices[-1].finish_reason == "tool_calls"


def test_the_tool_call_goes_back_into_the_next_prompt_token_for_token(client, tool_calling_checkpoint):
    first = _ask(client).choices[0].message
    history = [*ASK, first.model_dump(exclude_none=True),
               {"role": "tool", "tool_call_id": first.tool_calls[0].id, "content": "sunny"}]
    second = client.chat.completions.create(model="tool-caller", messages=history, tools=TOOLS, max_tokens=2,
                                            extra_body={"return_token_ids": True})
    tokenizer = AutoTokenizer.from_pretrained(tool_calling_checkpoint)
    expected = tokenizer.apply_chat_template(history, tools=TOOLS, add_generation_prompt=True, return_dict=False)
    assert second.prompt_token_ids == expected
    sampled = _ask(client).choices[0].token_ids
    first_prompt = tokenizer.apply_chat_template(ASK, tools=TOOLS, add_generation_prompt=True, return_dict=False)
    # the next prompt extends prompt + sampled ids exactly: the sample can be merged (DESIGN: prefix merging)
    assert expected[: len(first_prompt) + len(sampled)] == first_prompt + sampled
    assert "<tool_response>\nsunny\n</tool_response>" in tokenizer.decode(expected)
