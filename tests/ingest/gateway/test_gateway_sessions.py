"""Token sessions end to end: the official openai client, multi-turn with tools, through the gateway.

Engines: ``devkit.split_engine`` (samples non-canonical token splits and Hermes
tool calls, so re-rendered histories never give back the sampled ids) and the
reference engine ``serve-model`` (tiny real model). With sessions every
rollout merges into one sample whose response ids are what the engine
sampled; each fallback reason is exercised; a restarted gateway falls back
once and recovers.
"""

from __future__ import annotations

import gc
import json
import shutil

import httpx
import numpy as np
import pytest
from gateway_helpers import KEY, memory_emitter, serve, wait_for, wire_event
from openai import OpenAI

from devkit.split_engine import create_split_engine
from ingest.gateway import create_gateway_app
from pipelines.datasets.merging import Call, merge_calls
from serve.app import create_serve_app
from store.prompts import StoredCall, full_prompts

TOOLS = [{"type": "function", "function": {
    "name": "calculator", "description": "Evaluate an arithmetic expression",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}]
SYSTEM = {"role": "system", "content": "You are a careful calculator agent."}


@pytest.fixture(scope="module")
def split_engine(tiny_model_dir):
    app = create_split_engine(tiny_model_dir)
    with serve(app) as url:
        yield f"{url}/v1", app


@pytest.fixture(scope="module")
def serve_model(tiny_model_dir):
    app = create_serve_app(tiny_model_dir, served_name="tiny", max_new_tokens_cap=24)
    with serve(app) as url:
        yield f"{url}/v1"


@pytest.fixture
def session_settings(settings, tiny_model_dir):
    settings.tokenizer = str(tiny_model_dir)
    settings.token_sessions = True
    settings.upstream_timeout_s = 60.0
    return settings


def client(url: str, rollout: str, **headers: str) -> OpenAI:
    return OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0,
                  default_headers={"x-trajlake-task-id": "task-1", "x-trajlake-rollout-id": rollout, **headers})


def ask(llm: OpenAI, messages: list[dict], *, stream: bool, model: str = "split", **options) -> dict:
    """One chat call; the assistant message as a harness sends it back (streamed answers assembled)."""
    if not stream:
        message = llm.chat.completions.create(model=model, messages=messages, **options).choices[0].message
        return message.model_dump(exclude_none=True)
    content, calls = "", {}
    for chunk in llm.chat.completions.create(model=model, messages=messages, stream=True, **options):
        for choice in chunk.choices:
            content += choice.delta.content or ""
            for call in choice.delta.tool_calls or ():
                entry = calls.setdefault(call.index, {"id": call.id, "type": "function",
                                                      "function": {"name": "", "arguments": ""}})
                entry["function"]["name"] += call.function.name or ""
                entry["function"]["arguments"] += call.function.arguments or ""
    message = {"role": "assistant", "content": content or None}
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    return message


def tool_rollout(llm: OpenAI, *, turns: int, stream: bool, model: str = "split", tools=TOOLS, **options) -> list[dict]:
    """A calculator agent: answer each tool call, say ``final`` in the last result; returns the answers."""
    messages = [SYSTEM, {"role": "user", "content": "What is 17 + 25?"}]
    answers = []
    for turn in range(turns):
        answer = ask(llm, messages, stream=stream, model=model, tools=tools, **options)
        answers.append(answer)
        if not answer.get("tool_calls"):
            break
        messages.append(answer)
        for call in answer["tool_calls"]:
            assert json.loads(call["function"]["arguments"])  # parsed by the gateway's Hermes parser
            last = " final" if turn == turns - 2 else ""
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": f"{turn * 7}{last}"})
    return answers


def recorded(sink) -> list[tuple[dict, dict]]:
    """(llm.request payload + envelope, llm.response payload) per call, in request order."""
    events = [wire_event(v) for _, v in sink.records]
    responses = {e["payload"]["call_id"]: e["payload"] for e in events if e["type"] == "llm.response"}
    requests = sorted((e for e in events if e["type"] == "llm.request"), key=lambda e: e["seq"])
    return [(r, responses[r["payload"]["call_id"]]) for r in requests]


def full_prompts_of(calls: list[tuple[dict, dict]]) -> dict[str, np.ndarray]:
    """call_id -> full prompt ids, prefix references resolved per rollout (every one must resolve)."""
    by_rollout: dict[str, list[StoredCall]] = {}
    for request, response in calls:
        p = request["payload"]
        by_rollout.setdefault(request["rollout_id"], []).append(StoredCall(
            p["call_id"], p["prompt_token_ids"], response["response_token_ids"], p.get("extends_call_id"),
            p.get("extends_tokens")))
    out: dict[str, np.ndarray] = {}
    for stored in by_rollout.values():
        prompts, problems = full_prompts(stored)
        assert problems == {}
        out.update(prompts)
    return out


def samples_by_rollout(calls: list[tuple[dict, dict]]) -> dict[str, list]:
    prompts = full_prompts_of(calls)
    by_rollout: dict[str, list[Call]] = {}
    for request, response in calls:
        payload = request["payload"]
        by_rollout.setdefault(request["rollout_id"], []).append(Call(
            call_id=payload["call_id"], span_id=None, tokenizer=payload["tokenizer"],
            chat_template_hash=payload["chat_template_hash"],
            prompt=prompts[payload["call_id"]].astype(np.int64),
            response=np.array(response["response_token_ids"], dtype=np.int64), logprobs=None))
    return {rollout: merge_calls(calls) for rollout, calls in by_rollout.items()}


def made(calls: list[tuple[dict, dict]]) -> list[str]:
    return [(lambda m: m["made"] if m["made"] == "stitched" else m.get("fallback"))(
        r["payload"]["params"]["trajlake_prompt"]) for r, _ in calls]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_tool_rollouts_are_one_sample_of_the_sampled_ids_with_sessions(session_settings, split_engine, tmp_path,
                                                                      stream):
    session_settings.upstream_url = split_engine[0]
    engine = split_engine[1]
    engine.state.sampled.clear()
    emitter, sink = memory_emitter(tmp_path)
    with serve(create_gateway_app(session_settings, emitter=emitter)) as url:
        answers = {r: tool_rollout(client(url, r), turns=5, stream=stream) for r in ("ro-a", "ro-b")}
        metrics = httpx.get(f"{url}/metrics").text
    wait_for(lambda: len(sink.records) == 20, what="20 events", detail=lambda: len(sink.records))
    calls = recorded(sink)
    assert sorted(made(calls)) == ["first_call"] * 2 + ["stitched"] * 8
    assert 'trajlake_gateway_prompts_total{made="stitched",reason=""} 8.0' in metrics
    samples = samples_by_rollout(calls)
    assert {r: len(s) for r, s in samples.items()} == {"ro-a": 1, "ro-b": 1}
    # the recorded ids are what the engine sampled, call for call, and the one sample holds them all
    sampled = [s["token_ids"] for s in engine.state.sampled]
    assert sorted(map(tuple, sampled)) == sorted(tuple(resp["response_token_ids"]) for _, resp in calls)
    # stitched calls are stored once: a reference to the previous call + only the new ids, and the full prompt
    # rebuilt from them is exactly what the engine received
    stitched = [r["payload"] for r, _ in calls if r["payload"]["params"]["trajlake_prompt"]["made"] == "stitched"]
    assert all(p["extends_call_id"] and p["extends_tokens"] > len(p["prompt_token_ids"]) for p in stitched)
    received = sorted(tuple(s["prompt_token_ids"]) for s in engine.state.sampled)
    assert sorted(tuple(ids.tolist()) for ids in full_prompts_of(calls).values()) == received
    for rollout, (sample,) in samples.items():
        ids = [resp["response_token_ids"] for req, resp in calls if req["rollout_id"] == rollout]
        tokens, mask, _ = sample.arrays()
        assert tokens[mask == 1].tolist() == [t for call in ids for t in call]
        # the client saw the engine's text and tool calls, parsed
        assert [bool(a.get("tool_calls")) for a in answers[rollout]] == [True] * 4 + [False]
        assert answers[rollout][-1]["content"].startswith("The answer after 4 steps")


def test_without_sessions_the_same_rollouts_break_into_several_samples(settings, split_engine, tiny_model_dir,
                                                                      tmp_path):
    settings.upstream_url = split_engine[0]
    emitter, sink = memory_emitter(tmp_path)
    with serve(create_gateway_app(settings, emitter=emitter)) as url:
        tool_rollout(client(url, "ro-plain"), turns=5, stream=False)
    wait_for(lambda: len(sink.records) == 10, what="10 events")
    calls = recorded(sink)
    assert all("trajlake_prompt" not in r["payload"]["params"] for r, _ in calls)
    assert len(samples_by_rollout(calls)["ro-plain"]) > 1


def test_every_fallback_reason_goes_the_plain_route_and_is_counted(session_settings, split_engine, tiny_model_dir,
                                                                   tmp_path):
    session_settings.upstream_url = split_engine[0]
    emitter, sink = memory_emitter(tmp_path)
    first = [SYSTEM, {"role": "user", "content": "What is 2 + 2?"}]
    with serve(create_gateway_app(session_settings, emitter=emitter)) as url:
        llm = client(url, "ro-fb")
        answer = ask(llm, first, stream=False, tools=TOOLS)                               # first_call
        tool = {"role": "tool", "tool_call_id": answer["tool_calls"][0]["id"], "content": "4"}
        edited = {**answer, "tool_calls": [{**answer["tool_calls"][0], "function": {
            "name": "calculator", "arguments": '{"expression": "1 + 1"}'}}]}
        ask(llm, [*first, edited, tool], stream=False, tools=TOOLS)                       # history_changed
        answer = ask(llm, first, stream=False, tools=TOOLS)                               # history_changed (a retry)
        tool = {"role": "tool", "tool_call_id": answer["tool_calls"][0]["id"], "content": "4"}
        other_tools = [{"type": "function", "function": {**TOOLS[0]["function"], "description": "Compute"}}]
        ask(llm, [*first, answer, tool], stream=False, tools=other_tools)                 # context_changed
        picture = {"role": "user", "content": [{"type": "text", "text": "and this?"},
                                               {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}}]}
        llm.chat.completions.create(model="split", messages=[*first, picture])           # multimodal
        answer = ask(llm, first, stream=False, tools=TOOLS)                               # context_changed
        tool = {"role": "tool", "tool_call_id": answer["tool_calls"][0]["id"], "content": "4"}
        ask(llm, [*first, answer, tool], stream=False, tools=TOOLS, n=1,
            extra_body={"guided_json": {"type": "object"}})                              # unsupported_params
        unattached = OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0)
        ask(unattached, [*first, answer, tool], stream=False, tools=TOOLS)                # unattached
        ask(client(url, "ro-other"), [*first, answer, tool], stream=False, tools=TOOLS)   # no_session
        metrics = httpx.get(f"{url}/metrics").text
    wait_for(lambda: len(sink.records) == 18, what="18 events", detail=lambda: len(sink.records))
    assert made(recorded(sink)) == ["first_call", "history_changed", "history_changed", "context_changed",
                                    "multimodal", "context_changed", "unsupported_params", "unattached", "no_session"]
    for reason in ("first_call", "history_changed", "context_changed", "multimodal", "unsupported_params",
                   "unattached", "no_session"):
        assert f'trajlake_gateway_prompts_total{{made="engine_rendered",reason="{reason}"}}' in metrics


def _tokenizer_copy(tiny_model_dir, tmp_path, template: str):
    folder = tmp_path / "tok"
    shutil.copytree(tiny_model_dir, folder)
    if template is not None:
        (folder / "chat_template.jinja").write_text(template)
    return folder


def test_a_template_that_rewrites_history_and_an_unknown_parser_fall_back(session_settings, split_engine,
                                                                          tiny_model_dir, tmp_path):
    from devkit.tiny_model import CHAT_TEMPLATE

    session_settings.upstream_url = split_engine[0]
    # the system prompt counts the messages: every new turn rewrites the start of the conversation
    rewriting = CHAT_TEMPLATE.replace("{{- '<|im_start|>system\\n' + system -}}",
                                      "{{- '<|im_start|>system\\n' + system + (messages | length | string) -}}")
    assert rewriting != CHAT_TEMPLATE
    session_settings.tokenizer = str(_tokenizer_copy(tiny_model_dir, tmp_path, rewriting))
    emitter, sink = memory_emitter(tmp_path)
    with serve(create_gateway_app(session_settings, emitter=emitter)) as url:
        tool_rollout(client(url, "ro-rewrite"), turns=3, stream=False)
    wait_for(lambda: len(sink.records) == 6, what="6 events")
    assert made(recorded(sink)) == ["first_call", "template_not_prefix", "template_not_prefix"]

    session_settings.tokenizer = str(tiny_model_dir)
    session_settings.session_parser = "mistral"
    emitter, sink = memory_emitter(tmp_path / "2")
    with serve(create_gateway_app(session_settings, emitter=emitter)) as url:
        tool_rollout(client(url, "ro-parser"), turns=2, stream=False)
    wait_for(lambda: len(sink.records) == 4, what="4 events")
    assert made(recorded(sink)) == ["first_call", "unknown_parser"]


def test_a_restarted_gateway_falls_back_once_then_stitches_again(session_settings, split_engine, tmp_path):
    session_settings.upstream_url = split_engine[0]
    messages = [SYSTEM, {"role": "user", "content": "What is 17 + 25?"}]
    emitter, sink = memory_emitter(tmp_path)
    with serve(create_gateway_app(session_settings, emitter=emitter)) as url:
        llm = client(url, "ro-restart")
        for turn in range(2):
            answer = ask(llm, messages, stream=False, tools=TOOLS)
            messages += [answer, {"role": "tool", "tool_call_id": answer["tool_calls"][0]["id"], "content": str(turn)}]
    emitter2, sink2 = memory_emitter(tmp_path / "after")
    with serve(create_gateway_app(session_settings, emitter=emitter2)) as url:
        llm = client(url, "ro-restart")
        for turn in range(2, 4):
            answer = ask(llm, messages, stream=turn == 3, tools=TOOLS)
            messages += [answer, {"role": "tool", "tool_call_id": answer["tool_calls"][0]["id"], "content": str(turn)}]
    wait_for(lambda: len(sink.records) == 4 and len(sink2.records) == 4, what="8 events")
    assert made(recorded(sink)) + made(recorded(sink2)) == ["first_call", "stitched", "no_session", "stitched"]
    assert len(samples_by_rollout(recorded(sink) + recorded(sink2))["ro-restart"]) == 2  # one break, at the restart


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_serve_model_rollouts_are_one_sample_with_sessions(session_settings, serve_model, tmp_path, stream):
    """The tiny model samples freely (its ids rarely re-tokenize to themselves); answers cut at max_tokens."""
    session_settings.upstream_url = serve_model
    emitter, sink = memory_emitter(tmp_path)
    with serve(create_gateway_app(session_settings, emitter=emitter)) as url:
        for rollout in ("ro-s1", "ro-s2"):
            llm = client(url, rollout)
            messages = [SYSTEM, {"role": "user", "content": "Add 17 and 25."}]
            for turn in range(3):
                answer = ask(llm, messages, stream=stream, model="tiny", tools=TOOLS, max_tokens=12,
                             temperature=1.0, seed=turn)
                messages += [answer, {"role": "tool", "tool_call_id": "call_1", "content": str(turn)}]
    wait_for(lambda: len(sink.records) == 12, what="12 events")
    calls = recorded(sink)
    assert made(calls) == ["first_call", "stitched", "stitched"] * 2
    assert {r: len(s) for r, s in samples_by_rollout(calls).items()} == {"ro-s1": 1, "ro-s2": 1}
    assert all(resp["token_source"] == "engine" and resp["error"] is None for _, resp in calls)


def test_the_gateway_keeps_what_its_startup_built_out_of_full_collections(session_settings, tmp_path):
    """Token sessions load a tokenizer, which brings transformers and torch (~300k objects): a full collection
    walked them all, ~0.25 s of the request path (bench/session_latency). Frozen at startup, ~3 ms."""
    gc.unfreeze()
    emitter, _ = memory_emitter(tmp_path)
    with serve(create_gateway_app(session_settings, emitter=emitter)):
        assert gc.get_freeze_count() > 100_000
    assert gc.get_freeze_count() == 0  # a stopped gateway hands them back


def test_a_stopping_gateway_leaves_another_ones_startup_frozen(session_settings, tmp_path):
    """The freeze is the process's: the last gateway to stop hands the objects back, not the first (review2)."""
    gc.unfreeze()
    first, _ = memory_emitter(tmp_path / "first")
    second, _ = memory_emitter(tmp_path / "second")
    with serve(create_gateway_app(session_settings, emitter=first)):
        with serve(create_gateway_app(session_settings, emitter=second)):
            pass
        assert gc.get_freeze_count() > 100_000
    assert gc.get_freeze_count() == 0

