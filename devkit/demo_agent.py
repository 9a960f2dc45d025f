"""The demo's toy agent: a real OpenAI-client harness that talks through the gateway.

Each rollout asks the model a question, "runs" a calculator tool on the
answer, feeds the result back, and scores the final answer. Tool events, the
reward and start/finish go through the harness SDK; the LLM calls are
recorded by the gateway.

Two harness versions show that the harness is part of the policy:

- ``1.0`` (messages in, text out) sends chat messages; the engine re-renders
  the history with the chat template and re-tokenizes the model's own answers,
  which rarely gives back the ids it sampled, so merged samples break
  (``retokenization``).
- ``1.1`` (tokens in, tokens out) keeps the exact ids: each prompt is the
  previous prompt + the sampled ids + the tokenized tool observation, sent to
  ``/v1/completions``, so every call extends the rollout's sample.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from openai import OpenAI

from ingest.sdk import RolloutContext, TrajectoryClient

QUESTIONS = (
    "Add 17 and 25.", "What is 9 times 7?", "Subtract 13 from 50.", "Divide 144 by 12.",
    "Square 11.", "What is 2 to the power 10?",
)
SYSTEM = "You are a careful calculator agent."
TOKENS_IN = "1.1"


@dataclass(frozen=True)
class AgentSpec:
    harness_version: str
    turns: int = 3
    max_tokens: int = 16


def letter_share(text: str) -> float:
    """The demo's reward: the share of letters in the answer (a learnable preference)."""
    return sum(ch.isalpha() for ch in text) / max(1, len(text))


def run_rollout(
    client: TrajectoryClient, llm: OpenAI, tokenizer: Any, *, task_id: str, rollout_id: str, spec: AgentSpec, seed: int
) -> float:
    """One rollout of the toy agent; returns its reward."""
    rng = random.Random(seed)
    question = QUESTIONS[int(task_id.rsplit("-", 1)[1]) % len(QUESTIONS)]
    messages: list[dict] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
    headers = {
        "X-Trajlake-Task-Id": task_id, "X-Trajlake-Rollout-Id": rollout_id,
        "X-Trajlake-Harness": "demo-agent", "X-Trajlake-Harness-Version": spec.harness_version,
    }
    prompt_ids: list[int] = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                           return_dict=False)
    answer = ""
    with client.rollout(task_id, rollout_id=rollout_id, policy_version="tiny-v0") as rollout:
        for turn in range(spec.turns):
            options = dict(model="tiny", max_tokens=spec.max_tokens, temperature=1.0, seed=seed * 100 + turn,
                           extra_headers=headers)
            if spec.harness_version == TOKENS_IN:
                reply = llm.completions.create(prompt=prompt_ids, extra_body={"return_token_ids": True}, **options)
                answer, sampled = reply.choices[0].text, reply.choices[0].model_extra["token_ids"]
            else:
                reply = llm.chat.completions.create(messages=messages, **options)
                answer, sampled = reply.choices[0].message.content or "", []
            if turn == spec.turns - 1:
                break
            result = _run_calculator(rollout, answer, rng)
            messages += [{"role": "assistant", "content": answer}, {"role": "tool", "content": result}]
            prompt_ids = prompt_ids + sampled + _observation_ids(tokenizer, result, sampled)
        reward = letter_share(answer)
        rollout.reward("letter_share", reward, source="demo-grader")
        rollout.set_status("succeeded" if reward >= 0.5 else "failed", steps=spec.turns)
    return reward


def _run_calculator(rollout: RolloutContext, answer: str, rng: random.Random) -> str:
    call_id = rollout.tool_call("calculator", {"expression": answer[:40]})
    result = str(rng.randint(0, 999))
    rollout.tool_result(call_id, "calculator", result, duration_ms=rng.uniform(1, 20), state_changed=rng.random() < 0.5)
    return result


def _observation_ids(tokenizer: Any, result: str, sampled: list[int]) -> list[int]:
    """The tool turn in the chat template's own markup, after the model's answer, as token ids."""
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    closing = "" if sampled and sampled[-1] == end else "<|im_end|>"
    text = f"{closing}\n<|im_start|>tool\n{result}<|im_end|>\n<|im_start|>assistant\n"
    return tokenizer(text, add_special_tokens=False)["input_ids"]


SESSION_CALLS_SQL = """
    SELECT rollout_id, call_id, m.messages, params, prompt_token_ids, response_token_ids, extends_call_id, extends_tokens
    FROM llm_calls AS c JOIN llm_call_messages AS m USING (tenant, rollout_id, call_id)
    WHERE harness_name = 'demo-agent' AND harness_version = '1.0' AND error IS NULL
    ORDER BY rollout_id, c.seq"""
"""The demo's calls, with their full messages (the gateway stores them as references)."""


def token_sessions_before_after(lake: Any, tokenizer: Any) -> dict[str, Any]:
    """Samples per ``demo-agent@1.0`` rollout as recorded through token sessions ("after") and with the same
    calls' prompts as the engine renders them from the messages without sessions ("before"); prompts by how made."""
    import json
    from collections import Counter

    import numpy as np

    from pipelines.datasets.merging import Call, merge_calls
    from store.prompts import full_prompts, stored_calls
    from store.sql import run_query

    rows = run_query(lake, SESSION_CALLS_SQL).to_pylist()
    full: dict[str, Any] = {}
    for rollout in {row["rollout_id"] for row in rows}:  # prefix references resolved to full prompts
        full.update(full_prompts(stored_calls(r for r in rows if r["rollout_id"] == rollout))[0])
    made: Counter[str] = Counter()
    after: dict[str, list[Call]] = {}
    before: dict[str, list[Call]] = {}
    for row in rows:
        prompt = (json.loads(row["params"] or "{}").get("trajlake_prompt") or {})
        made[prompt.get("made", "engine_rendered") + (f" ({prompt['fallback']})" if prompt.get("fallback") else "")] += 1
        rendered = tokenizer.apply_chat_template(json.loads(row["messages"]), add_generation_prompt=True,
                                                 tokenize=True, return_dict=False)
        response = np.array(row["response_token_ids"], dtype=np.int64)
        for calls, prompt_ids in ((after, full.get(row["call_id"], [])), (before, rendered)):
            calls.setdefault(row["rollout_id"], []).append(Call(
                call_id=row["call_id"], span_id=None, tokenizer=None, chat_template_hash=None,
                prompt=np.array(prompt_ids, dtype=np.int64), response=response, logprobs=None))

    def per_rollout(calls: dict[str, list[Call]]) -> float:
        return round(sum(len(merge_calls(c)) for c in calls.values()) / max(1, len(calls)), 2)

    return {"rollouts": len(after), "prompts": dict(sorted(made.items())),
            "samples_per_rollout_before": per_rollout(before), "samples_per_rollout_after": per_rollout(after)}
