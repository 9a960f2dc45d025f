"""A filled skeleton equals a render: empty keys, and a shape shared by rollouts whose earlier messages differ."""

from __future__ import annotations

import pytest

from ingest.gateway.sessions.state import SessionStore
from ingest.gateway.sessions.stitch import Stitcher


def rollout(tok, tools: list[dict]) -> list[tuple[str, bool]]:
    """Each call's (how made, same ids as a fresh whole render) over tool turns whose tool message is ``tools[n]``."""
    store = SessionStore(max_bytes=1 << 20, ttl_s=60)
    stitcher = Stitcher(tok, store, parser="hermes")
    key = ("t", "r", 0, None)
    end = tok.convert_tokens_to_ids("<|im_end|>")
    messages: list[dict] = [{"role": "system", "content": "s"}, {"role": "user", "content": "go"}]
    out = []
    for n, tool in enumerate([*tools, None]):
        kept = store.get(key)
        plan = stitcher.plan({"model": "m", "messages": messages}, key)
        same = True
        if kept is not None:
            store.put(key, kept)
            whole = Stitcher(tok, store, parser="hermes").plan({"model": "m", "messages": messages}, key)
            same = whole.prompt_ids == plan.prompt_ids
        stitcher.remember(plan, prompt_ids=plan.prompt_ids or [1, 2], sampled_ids=tok.encode(f"step {n}") + [end],
                          content=f"step {n}", tool_calls=None)
        out.append((plan.made if plan.made == "stitched" else plan.reason, same))
        messages = [*messages, {"role": "assistant", "content": f"step {n}"}, tool]
    return out


@pytest.fixture
def tok(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


CHATML = ("{%- for m in messages -%}<|im_start|>{{ m.role }}\n{{ BODY }}<|im_end|>\n{%- endfor -%}"
          "{%- if add_generation_prompt -%}<|im_start|>assistant\n{%- endif -%}")


@pytest.mark.parametrize("body, tools", [
    # a key holding "" is skipped like an absent one (text_fields, _kind), but `is defined` tells them apart
    ("m.content ~ (('|' ~ m.name) if m.name is defined else '')",
     [{"role": "tool", "content": "a"}, {"role": "tool", "content": "b"}, {"role": "tool", "content": "c"},
      {"role": "tool", "content": "d", "name": ""}]),
    ("(m.content if m.content is defined else '(no content)')",
     [{"role": "tool", "content": "a"}, {"role": "tool", "content": ""}, {"role": "tool", "content": ""},
      {"role": "tool"}]),
])
def test_a_filled_skeleton_gives_the_ids_a_render_gives(tok, body, tools):
    tok.chat_template = CHATML.replace("BODY", body)
    calls = rollout(tok, tools)
    assert all(same for _, same in calls), calls


def test_a_skeleton_learned_in_one_rollout_gives_another_the_ids_a_render_gives(tok):
    """The tail can depend on the text of a window message that is not new (here the system prompt chooses how tool
    results are wrapped): shapes are shared across rollouts."""
    tok.chat_template = (
        "{%- set wrap = 'tools as xml' in messages[0].content -%}"
        "{%- for m in messages -%}<|im_start|>{{ m.role }}\n"
        "{%- if m.role == 'tool' and wrap -%}<tool_response>{{ m.content }}</tool_response>"
        "{%- else -%}{{ m.content }}{%- endif -%}<|im_end|>\n{%- endfor -%}"
        "{%- if add_generation_prompt -%}<|im_start|>assistant\n{%- endif -%}")
    store = SessionStore(max_bytes=1 << 20, ttl_s=60)
    stitcher = Stitcher(tok, store, parser="hermes")
    end = tok.convert_tokens_to_ids("<|im_end|>")
    out = []
    for rollout_id, system in [("r1", "s, tools as xml"), ("r2", "s")]:
        key = ("t", rollout_id, 0, None)
        messages: list[dict] = [{"role": "system", "content": system}, {"role": "user", "content": "go"}]
        for n in range(4):
            kept = store.get(key)
            plan = stitcher.plan({"model": "m", "messages": messages}, key)
            if kept is not None:
                store.put(key, kept)
                whole = Stitcher(tok, store, parser="hermes").plan({"model": "m", "messages": messages}, key)
                out.append((rollout_id, n, plan.made, whole.prompt_ids == plan.prompt_ids))
            stitcher.remember(plan, prompt_ids=plan.prompt_ids or [1, 2], sampled_ids=tok.encode(f"step {n}") + [end],
                              content=f"step {n}", tool_calls=None)
            messages = [*messages, {"role": "assistant", "content": f"step {n}"}, {"role": "tool", "content": f"t{n}"}]
    assert all(same for *_, same in out), out


def test_a_tail_that_shows_an_earlier_message_gets_no_skeleton(tok):
    """Each tool turn repeats the system prompt: a skeleton learned in one rollout would carry its text into
    another's prompt; the tail rendered with the earlier messages' text masked differs, so the shape renders."""
    tok.chat_template = (
        "{%- for m in messages -%}<|im_start|>{{ m.role }}\n"
        "{%- if m.role == 'tool' -%}({{ messages[0].content }}) {% endif -%}{{ m.content }}<|im_end|>\n{%- endfor -%}"
        "{%- if add_generation_prompt -%}<|im_start|>assistant\n{%- endif -%}")
    store = SessionStore(max_bytes=1 << 20, ttl_s=60)
    stitcher = Stitcher(tok, store, parser="hermes")
    end = tok.convert_tokens_to_ids("<|im_end|>")
    out = []
    for rollout_id, system in [("r1", "be brief"), ("r2", "be thorough")]:
        key = ("t", rollout_id, 0, None)
        messages: list[dict] = [{"role": "system", "content": system}, {"role": "user", "content": "go"}]
        for n in range(4):
            kept = store.get(key)
            plan = stitcher.plan({"model": "m", "messages": messages}, key)
            if kept is not None:
                store.put(key, kept)
                whole = Stitcher(tok, store, parser="hermes").plan({"model": "m", "messages": messages}, key)
                out.append((rollout_id, n, plan.made, whole.prompt_ids == plan.prompt_ids))
            stitcher.remember(plan, prompt_ids=plan.prompt_ids or [1, 2], sampled_ids=tok.encode(f"step {n}") + [end],
                              content=f"step {n}", tool_calls=None)
            messages = [*messages, {"role": "assistant", "content": f"step {n}"}, {"role": "tool", "content": f"t{n}"}]
    assert all(same for *_, same in out), out
