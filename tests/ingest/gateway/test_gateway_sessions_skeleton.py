"""A checked shape's skeleton: the new turns filled in from the new messages' text, never different from a render."""

from __future__ import annotations

import pytest

from ingest.gateway.sessions.skeleton import Literals
from ingest.gateway.sessions.state import SessionStore
from ingest.gateway.sessions.stitch import Stitcher

TEXTS = ['plain', ' "quoted" \\ back\\slash ', '<tag> & </tag>\n\nnext line', 'ünïcödé ✓ \t', '{"a": 1}']


def template(content: str) -> str:
    """A ChatML template that writes each message's text through ``content`` (a Jinja expression of ``m``)."""
    return ("{%- for m in messages -%}<|im_start|>{{ m.role }}\n{{ " + content + " }}<|im_end|>\n{%- endfor -%}"
            "{%- if add_generation_prompt -%}<|im_start|>assistant\n{%- endif -%}")


def rollout(tok, texts: list[str | dict], *, system: str = "s", stitcher: Stitcher | None = None,
            rollout_id: str = "r") -> list[tuple[str, int, bool]]:
    """Each call's (how made, renders, same ids as rendering the whole conversation) over tool turns of ``texts``
    (a text: the tool message's content; a dict: the tool message itself). ``stitcher``: one shared with other
    rollouts (shapes and skeletons are per stitcher)."""
    renders: list[int] = []
    render = tok.apply_chat_template
    tok.apply_chat_template = lambda messages, **kw: renders.append(len(messages)) or render(messages, **kw)
    stitcher = stitcher or Stitcher(tok, SessionStore(max_bytes=1 << 20, ttl_s=60), parser="hermes")
    store = stitcher.store
    key = ("t", rollout_id, 0, None)
    end = tok.convert_tokens_to_ids("<|im_end|>")
    messages: list[dict] = [{"role": "system", "content": system}, {"role": "user", "content": "go"}]
    out = []
    for n, text in enumerate([*texts, None]):  # call n's new message holds texts[n - 1]
        kept = store.get(key)
        renders.clear()
        plan = stitcher.plan({"model": "m", "messages": messages}, key)
        made = (plan.made if plan.made == "stitched" else plan.reason, len(renders))
        same = True
        if kept is not None:
            store.put(key, kept)
            whole = Stitcher(tok, store, parser="hermes").plan({"model": "m", "messages": messages}, key)
            same = whole.prompt_ids == plan.prompt_ids
        stitcher.remember(plan, prompt_ids=plan.prompt_ids or [1, 2], sampled_ids=tok.encode(f"step {n}") + [end],
                          content=f"step {n}", tool_calls=None)
        out.append((*made, same))
        tool = text if isinstance(text, dict) else {"role": "tool", "content": text}
        messages = [*messages, {"role": "assistant", "content": f"step {n}"}, tool]
    tok.apply_chat_template = render
    return out


@pytest.fixture
def tok(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def test_a_template_that_writes_the_text_as_is_fills_its_skeleton_with_the_ids_a_render_gives(tok):
    tok.chat_template = template("m.content or ''")
    calls = rollout(tok, TEXTS)
    assert all(same for *_, same in calls) and all(made == "stitched" for made, _, _ in calls[1:])
    assert [renders for _, renders, _ in calls[3:]] == [0] * (len(calls) - 3)  # filled, not rendered


def test_a_shape_checked_on_one_rollout_fills_the_next_rollouts_calls_from_their_first_stitched_one(tok):
    """The first stitched call of a rollout (its window is the whole conversation) has a shape too: a later rollout
    renders nothing once an earlier one checked it."""
    tok.chat_template = template("m.content or ''")
    stitcher = Stitcher(tok, SessionStore(max_bytes=1 << 20, ttl_s=60), parser="hermes")
    rollout(tok, TEXTS, stitcher=stitcher, rollout_id="r0")
    calls = rollout(tok, TEXTS, stitcher=stitcher, rollout_id="r1")
    assert all(same for *_, same in calls) and [made for made, _, _ in calls] == ["first_call"] + ["stitched"] * 5
    assert [renders for _, renders, _ in calls] == [0] * len(calls)


@pytest.mark.parametrize("content", ["(m.content or '') | trim", "(m.content or '') | tojson",
                                     "(m.content or '').replace('\"', '')"])
def test_a_template_that_rewrites_the_text_renders_every_call(tok, content):
    tok.chat_template = template(content)
    calls = rollout(tok, TEXTS)
    assert all(same for *_, same in calls) and all(made == "stitched" for made, _, _ in calls[1:])
    assert all(renders > 0 for _, renders, _ in calls[1:])  # the sentinels did not come out verbatim: no skeleton


def test_a_text_holding_a_literal_the_template_tests_is_rendered(tok):
    tok.chat_template = template("'(hidden)' if '<secret>' in (m.content or '') else (m.content or '')")
    calls = rollout(tok, ["a", "b", "c", "a <secret> b", "d", "e"])
    assert all(same for *_, same in calls) and all(made == "stitched" for made, _, _ in calls[1:])
    # the secret's call renders its window, so does the next (the secret is then in the window, before the answer)
    assert [renders for _, renders, _ in calls[3:]] == [0, 2, 2, 0]


def test_the_literals_are_those_a_text_is_tested_against_not_roles_or_joins():
    literals = Literals("{%- for m in messages -%}{%- if m.role == 'user' and m['type'] != 'text' -%}"
                        "{{ m.content.startswith('<tool_response>') }}{{ '</think>' in m.content }}"
                        "{{ m.content | replace('<a>', '<b>') }}{{ m.names | join(', ') }}{%- endif -%}{%- endfor -%}")
    assert literals.usable
    assert [literals.guard(t) for t in ("<tool_response>x", "a</think>", "<a>", "user", "text", "x, y", "plain")] \
        == [True, True, True, False, False, False, False]
    assert not Literals("{% generation %}{{ x }}{% endgeneration %}").usable  # another environment's tags
    assert not Literals(None).usable


@pytest.mark.parametrize("content", ["(m.content or '')[:40]", "(m.content or '') | truncate(40, True, '')",
                                     "'long' if (m.content or '') | length > 40 else (m.content or '')",
                                     "'a number' if (m.content or '').isdigit() else (m.content or '')"])
def test_a_template_that_measures_or_slices_the_text_renders_every_call(tok, content):
    """The sentinel (21 characters, no digit only) comes out whole where a longer text is cut or a number is
    replaced: filled, the skeleton would write the text as it is."""
    tok.chat_template = template(content)
    calls = rollout(tok, ["a", "b", "c", "a text longer than the forty characters the template keeps", "42", "d"])
    assert all(same for *_, same in calls) and all(made == "stitched" for made, _, _ in calls[1:])
    assert all(renders > 0 for _, renders, _ in calls[1:])
    assert Literals("{% for m in messages[::-1] %}{{ m.content }}{{ messages | length }}{% endfor %}").usable


@pytest.mark.parametrize("content, tools", [
    # a key holding "" counts as present: `is defined` tells it from an absent one
    ("m.content ~ (('|' ~ m.name) if m.name is defined else '')",
     [{"role": "tool", "content": "a"}, {"role": "tool", "content": "b"}, {"role": "tool", "content": "c"},
      {"role": "tool", "content": "d", "name": ""}]),
    ("(m.content if m.content is defined else '(no content)')",
     [{"role": "tool", "content": "a"}, {"role": "tool", "content": ""}, {"role": "tool", "content": ""},
      {"role": "tool"}]),
])
def test_a_new_message_fills_a_skeleton_only_with_the_same_keys(tok, content, tools):
    tok.chat_template = template(content)
    assert all(same for *_, same in rollout(tok, tools))


@pytest.mark.parametrize("content, systems", [
    # the system prompt chooses how tool results are wrapped (a literal tested on an earlier message)
    ("('<tool_response>' ~ m.content ~ '</tool_response>') if m.role == 'tool' and 'tools as xml' in "
     "messages[0].content else m.content", ["s, tools as xml", "s"]),
    # each tool turn repeats the system prompt (an earlier message's text shown in the new turns)
    ("('(' ~ messages[0].content ~ ') ' ~ m.content) if m.role == 'tool' else m.content", ["be brief", "be thorough"]),
])
def test_a_skeleton_shared_by_rollouts_never_carries_one_rollouts_text_into_another(tok, content, systems):
    """Shapes (and their skeletons) are shared by the rollouts of a gateway; the new turns may depend on the text
    of an earlier message that differs between them."""
    tok.chat_template = template(content)
    stitcher = Stitcher(tok, SessionStore(max_bytes=1 << 20, ttl_s=60), parser="hermes")
    calls = [c for n, system in enumerate(systems)
             for c in rollout(tok, ["t0", "t1", "t2"], system=system, stitcher=stitcher, rollout_id=f"r{n}")]
    assert all(same for *_, same in calls), calls
