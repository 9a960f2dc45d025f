"""The demo's toy agent: a real OpenAI-client harness that talks through the gateway.

Each rollout asks the model a question, "runs" a calculator tool on the
answer, feeds the result back (so the next prompt extends the previous one),
and scores the final answer. Tool events, the reward and start/finish go
through the harness SDK; the LLM calls are recorded by the gateway.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from openai import OpenAI

from ingest.sdk import TrajectoryClient

QUESTIONS = (
    "Add 17 and 25.", "What is 9 times 7?", "Subtract 13 from 50.", "Divide 144 by 12.",
    "Square 11.", "What is 2 to the power 10?",
)


@dataclass(frozen=True)
class AgentSpec:
    harness_version: str
    turns: int = 3
    max_tokens: int = 16


def letter_share(text: str) -> float:
    """The demo's reward: the share of letters in the answer (a learnable preference)."""
    return sum(ch.isalpha() for ch in text) / max(1, len(text))


def run_rollout(
    client: TrajectoryClient, llm: OpenAI, *, task_id: str, rollout_id: str, spec: AgentSpec, seed: int
) -> float:
    """One rollout of the toy agent; returns its reward."""
    rng = random.Random(seed)
    question = QUESTIONS[int(task_id.rsplit("-", 1)[1]) % len(QUESTIONS)]
    messages: list[dict] = [
        {"role": "system", "content": "You are a careful calculator agent."},
        {"role": "user", "content": question},
    ]
    headers = {
        "X-Trajlake-Task-Id": task_id, "X-Trajlake-Rollout-Id": rollout_id,
        "X-Trajlake-Harness": "demo-agent", "X-Trajlake-Harness-Version": spec.harness_version,
    }
    answer = ""
    with client.rollout(task_id, rollout_id=rollout_id, policy_version="tiny-v0") as rollout:
        for turn in range(spec.turns):
            reply = llm.chat.completions.create(
                model="tiny", messages=messages, max_tokens=spec.max_tokens, temperature=1.0,
                seed=seed * 100 + turn, extra_headers=headers,
            )
            answer = reply.choices[0].message.content or ""
            messages.append({"role": "assistant", "content": answer})
            if turn == spec.turns - 1:
                break
            call_id = rollout.tool_call("calculator", {"expression": answer[:40]})
            result = str(rng.randint(0, 999))
            rollout.tool_result(call_id, "calculator", result, duration_ms=rng.uniform(1, 20),
                                state_changed=rng.random() < 0.5)
            messages.append({"role": "tool", "content": result, "tool_call_id": call_id})
        reward = letter_share(answer)
        rollout.reward("letter_share", reward, source="demo-grader")
        rollout.set_status("succeeded" if reward >= 0.5 else "failed")
    return reward
