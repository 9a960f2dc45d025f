"""The naive baseline: the same build as a per-call Python loop over Python lists.

Reads whole tables into Python objects, compares token lists with ``==`` on
list slices, builds masks element by element. Same rules as the pipeline for
the default config (finished rollouts, latest reward, GRPO by group, engine
calls deduplicated by idempotency key / call id, longest-prefix merging), so
its sample and token counts must equal the pipeline's: the bench checks that.
"""

from __future__ import annotations

import math
from collections import defaultdict

import pyarrow as pa
from deltalake import write_deltalake

from schemas.tables import (
    LLM_REQUESTS_TABLE,
    LLM_RESPONSES_TABLE,
    REWARDS_TABLE,
    ROLLOUT_ENDS_TABLE,
    ROLLOUT_STARTS_TABLE,
    SAMPLES,
    dataset_table,
)
from store.lake import Lake


def naive_build(lake: Lake, name: str) -> dict[str, int]:
    starts = {r["rollout_id"]: r for r in lake.read(ROLLOUT_STARTS_TABLE).to_pylist()}
    finished = {r["rollout_id"] for r in lake.read(ROLLOUT_ENDS_TABLE).to_pylist()}
    latest: dict[str, tuple] = {}
    for r in lake.read(REWARDS_TABLE).to_pylist():
        key = (r["ts"], r["seq"], r["event_id"])
        if r["rollout_id"] not in latest or key > latest[r["rollout_id"]][0]:
            latest[r["rollout_id"]] = (key, r["value"])
    rollouts = sorted(r for r in starts if r in finished and r in latest)
    advantage = _grpo({r: latest[r][1] for r in rollouts}, {r: starts[r]["group_id"] for r in rollouts})
    calls = _engine_calls(lake, set(rollouts))
    samples = {r: _merge(calls.get(r, [])) for r in rollouts}
    trained = {r: sum(sum(s["mask"]) for s in ss) for r, ss in samples.items()}
    n_with = sum(1 for t in trained.values() if t > 0)
    rows = []
    for r in (r for r in rollouts if trained[r] > 0):
        for k, s in enumerate(samples[r]):
            rows.append({
                "sample_id": f"{r}/{k}", "tenant": starts[r]["tenant"], "task_id": starts[r]["task_id"],
                "rollout_id": r, "group_id": starts[r]["group_id"], "sample_index": k, "start_reason": "first",
                "call_ids": s["calls"], "policy_version": starts[r]["policy_version"], "tokenizer": None,
                "input_ids": s["ids"], "loss_mask": s["mask"], "old_logprobs": s["logprobs"],
                "advantage": advantage[r], "token_weight": 1 / (n_with * trained[r]), "reward": latest[r][1],
                "n_tokens": len(s["ids"]), "n_trained_tokens": sum(s["mask"]),
            })
    write_deltalake(lake.write_uri(dataset_table(name)), pa.Table.from_pylist(rows, schema=SAMPLES), mode="overwrite")
    return {"rollouts": n_with, "samples": len(rows), "tokens": sum(r["n_tokens"] for r in rows),
            "trained_tokens": sum(r["n_trained_tokens"] for r in rows)}


def _grpo(rewards: dict[str, float], groups: dict[str, str]) -> dict[str, float]:
    members = defaultdict(list)
    for r, g in groups.items():
        members[g].append(r)
    out = {}
    for rs in members.values():
        mean = sum(rewards[r] for r in rs) / len(rs)
        std = math.sqrt(sum((rewards[r] - mean) ** 2 for r in rs) / len(rs))
        for r in rs:
            out[r] = 0.0 if len(rs) == 1 or std <= 1e-6 else (rewards[r] - mean) / std
    return out


def _engine_calls(lake: Lake, rollouts: set[str]) -> dict[str, list[dict]]:
    responses = {}
    for r in sorted(lake.read(LLM_RESPONSES_TABLE).to_pylist(), key=lambda r: (r["seq"], r["event_id"])):
        responses.setdefault((r["rollout_id"], r["call_id"]), r)
    seen, calls = set(), defaultdict(list)
    requests = sorted(lake.read(LLM_REQUESTS_TABLE).to_pylist(), key=lambda r: (r["rollout_id"], r["seq"], r["event_id"]))
    for q in requests:
        resp = responses.get((q["rollout_id"], q["call_id"]))
        ok = (q["rollout_id"] in rollouts and resp is not None and resp["error"] is None
              and resp["token_source"] == "engine" and q["prompt_token_ids"] is not None
              and resp["response_token_ids"] is not None and resp["logprobs"] is not None
              and len(resp["logprobs"]) == len(resp["response_token_ids"]))
        keys = {(q["rollout_id"], q["call_id"]), (q["rollout_id"], q["idempotency_key"] or "call:" + q["call_id"])}
        if ok and not keys & seen:
            calls[q["rollout_id"]].append({"id": q["call_id"], "prompt": q["prompt_token_ids"],
                                           "response": resp["response_token_ids"], "logprobs": resp["logprobs"]})
            seen |= keys
    return calls


def _merge(calls: list[dict]) -> list[dict]:
    samples: list[dict] = []
    for call in calls:
        prompt, best = call["prompt"], None
        for s in samples:
            n = len(s["ids"])
            if n <= len(prompt) and prompt[:n] == s["ids"] and (best is None or n > len(best["ids"])):
                best = s
        if best is None:
            best = {"ids": [], "mask": [], "logprobs": [], "calls": []}
            samples.append(best)
        for _ in range(len(prompt) - len(best["ids"])):
            best["mask"].append(0)
            best["logprobs"].append(0.0)
        best["ids"] = list(prompt) + list(call["response"])
        for lp in call["logprobs"]:
            best["mask"].append(1)
            best["logprobs"].append(lp)
        best["calls"].append(call["id"])
    return samples
