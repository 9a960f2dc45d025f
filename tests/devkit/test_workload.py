"""The synthetic workload: valid, deterministic, and as irregular as promised."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest
from pydantic import ValidationError

import devkit.workload as workload
from devkit.workload import WorkloadConfig, generate_events, generate_rollouts
from schemas.events import EVENT_ADAPTER
from schemas.versions import validate_event

ROOT = Path(__file__).resolve().parents[2]
SMALL = dict(tasks=3, rollouts_per_task=3, max_context_tokens=1200, seed=11)
# Every irregularity often enough that a few rollouts show each one.
BUSY = dict(
    SMALL,
    subagent_rate=0.3, summarisation_rate=0.2, drift_rate=0.2, duplicate_send_rate=0.2,
    retry_request_rate=0.2, retokenized_rate=0.1, untokenized_rate=0.1, failure_rate=0.3,
    late_reward_rate=0.5, double_reward_rate=0.5,
)


@pytest.fixture(scope="module")
def busy() -> list[workload.SyntheticRollout]:
    return list(generate_rollouts(WorkloadConfig(**BUSY)))


@pytest.fixture(scope="module")
def busy_events() -> list[dict]:
    return list(generate_events(WorkloadConfig(**BUSY)))


def llm_pairs(rollout: workload.SyntheticRollout) -> dict[str, list[tuple[dict, dict]]]:
    """Per span: (request payload, response payload) of each distinct call, in order, retries dropped."""
    requests, seen_events, seen_keys = {}, set(), set()
    pairs: dict[str, list[tuple[dict, dict]]] = defaultdict(list)
    for event in rollout.events:
        if event["event_id"] in seen_events:
            continue
        seen_events.add(event["event_id"])
        payload = event["payload"]
        if event["type"] == "llm.request":
            requests[payload["call_id"]] = payload
        elif event["type"] == "llm.response":
            request = requests[payload["call_id"]]
            if request["idempotency_key"] not in seen_keys:
                seen_keys.add(request["idempotency_key"])
                pairs[event["span_id"]].append((request, payload))
    return pairs


def test_same_seed_gives_identical_events_and_ids():
    first = list(generate_events(WorkloadConfig(**SMALL)))
    again = list(generate_events(WorkloadConfig(**SMALL)))
    assert first == again
    other = list(generate_events(WorkloadConfig(**{**SMALL, "seed": 12})))
    assert {e["event_id"] for e in first}.isdisjoint({e["event_id"] for e in other})


def test_same_seed_gives_the_same_events_in_another_process():
    script = (
        "import hashlib, json; from devkit.workload import WorkloadConfig, generate_events; "
        "print(hashlib.sha256(json.dumps(list(generate_events(WorkloadConfig(tasks=2, rollouts_per_task=2, "
        "seed=5)))).encode()).hexdigest())"
    )
    digests = {
        subprocess.run([sys.executable, "-c", script], cwd=ROOT, env={**os.environ, "PYTHONHASHSEED": hash_seed},
                       capture_output=True, text=True, check=True).stdout
        for hash_seed in ("1", "2")
    }
    here = hashlib.sha256(json.dumps(list(generate_events(WorkloadConfig(tasks=2, rollouts_per_task=2, seed=5))))
                          .encode()).hexdigest()
    assert digests == {here + "\n"}


def test_a_rollout_does_not_depend_on_how_many_are_generated():
    two = list(generate_rollouts(WorkloadConfig(**{**SMALL, "tasks": 2})))
    three = list(generate_rollouts(WorkloadConfig(**SMALL)))
    assert [r.events for r in two] == [r.events for r in three[:len(two)]]


def test_every_event_satisfies_the_contract(busy_events):
    assert len(busy_events) > 300
    for event in busy_events:
        validate_event(event)
        EVENT_ADAPTER.validate_json(json.dumps(event), strict=True)  # the ingester's fast path


def test_events_are_all_rollouts_events_interleaved(busy, busy_events):
    by_rollout = defaultdict(list)
    for event in busy_events:
        by_rollout[event["rollout_id"]].append(event)
    assert [by_rollout[r.rollout_id] for r in busy] == [r.events for r in busy]
    first_rollout_positions = [i for i, e in enumerate(busy_events) if e["rollout_id"] == busy[0].rollout_id]
    assert first_rollout_positions[-1] - first_rollout_positions[0] >= len(first_rollout_positions)


def test_seq_follows_emission_order_inside_a_rollout(busy):
    for rollout in busy:
        seen: set[str] = set()
        firsts = [e for e in rollout.events if not (e["event_id"] in seen or seen.add(e["event_id"]))]
        assert [e["seq"] for e in firsts] == list(range(len(firsts)))  # a resend repeats its seq
        assert [e["ts"] for e in firsts] == sorted(e["ts"] for e in firsts)
        assert rollout.events[0]["type"] == "rollout.started"
        assert rollout.emitted_at_ms == sorted(rollout.emitted_at_ms)


def test_rollout_finished_then_rewards_match_the_facts(busy):
    for rollout in busy:
        types = [e["type"] for e in rollout.events]
        rewards = [e for e in rollout.events if e["type"] == "reward"]
        assert types[-len(rewards) - 1] == "rollout.finished"
        assert len(rewards) == (2 if rollout.facts.double_reward else 1)
        assert {r["payload"]["value"] for r in rewards} == {rollout.facts.reward}
        assert len({r["event_id"] for r in rewards}) == len(rewards)
        finished = rollout.events[types.index("rollout.finished")]
        assert finished["payload"]["status"] == rollout.facts.status
    assert {r.facts.status for r in busy} >= {"failed", "succeeded"}
    assert any(r.facts.double_reward for r in busy)


def test_late_rewards_come_after_every_other_rollouts_events(busy_events, busy):
    late = {r.rollout_id for r in busy if r.facts.late_reward}
    assert late and len(late) < len(busy)
    first_late = next(i for i, e in enumerate(busy_events) if e["type"] == "reward" and e["rollout_id"] in late)
    assert all(e["type"] == "reward" and e["rollout_id"] in late for e in busy_events[first_late:])


def test_prompts_extend_the_previous_call_except_on_summary_or_drift():
    config = WorkloadConfig(**{**BUSY, "untokenized_rate": 0.0})
    for rollout in generate_rollouts(config):
        extended = summarised = drifted = 0
        for calls in llm_pairs(rollout).values():
            for (prev_req, prev_resp), (req, _) in zip(calls, calls[1:]):
                history = prev_req["prompt_token_ids"] + prev_resp["response_token_ids"]
                prompt = req["prompt_token_ids"]
                if prompt[:len(history)] == history:
                    extended += 1
                elif prompt[:len(prev_req["prompt_token_ids"])] == prev_req["prompt_token_ids"]:
                    drifted += 1  # the earlier history kept, the last response re-tokenized
                else:
                    summarised += 1
        assert (summarised, drifted) == (rollout.facts.summarisations, rollout.facts.drifts)
        assert extended > 0


def test_contexts_grow_to_the_limit_and_never_past_it():
    config = WorkloadConfig(tasks=2, rollouts_per_task=2, seed=3, min_calls=20, max_calls=30)
    longest = 0
    for rollout in generate_rollouts(config):
        for calls in llm_pairs(rollout).values():
            for req, resp in calls:
                if req["prompt_token_ids"] is not None:
                    total = len(req["prompt_token_ids"]) + len(resp["response_token_ids"])
                    assert total <= config.max_context_tokens
                    longest = max(longest, len(req["prompt_token_ids"]))
    assert longest > config.max_context_tokens * 0.6


def test_subagents_have_their_own_span_and_interleave_with_the_parent(busy):
    interleaved = False
    for rollout in busy:
        root = rollout.events[0]["span_id"]
        llm = [e for e in rollout.events if e["type"] == "llm.request"]
        subs = {e["span_id"] for e in llm if e["span_id"] != root}
        assert len(subs) == rollout.facts.subagents or rollout.facts.status == "failed"
        for span in subs:
            positions = [i for i, e in enumerate(llm) if e["span_id"] == span]
            assert {llm[i]["parent_span_id"] for i in positions} == {root}
            interleaved |= any(e["span_id"] == root for e in llm[positions[0]:positions[-1]])
            first_prompt = llm[positions[0]]["payload"]["prompt_token_ids"]
            root_prompt = next(e for e in llm if e["span_id"] == root)["payload"]["prompt_token_ids"]
            if first_prompt and root_prompt:
                assert first_prompt[:20] != root_prompt[:20]  # its own context, not the parent's
    assert interleaved


def test_duplicates_resent_with_same_ids_and_retried_with_new_ids(busy):
    resent = retried = 0
    for rollout in busy:
        by_id = defaultdict(list)
        by_key = defaultdict(set)
        for event in rollout.events:
            by_id[event["event_id"]].append(event)
            if event["type"] == "llm.request":
                by_key[event["payload"]["idempotency_key"]].add(event["event_id"])
        copies = [group for group in by_id.values() if len(group) > 1]
        assert all(group[0] == group[1] and group[0] is not group[1] for group in copies)
        assert len(copies) == 2 * rollout.facts.duplicate_sends
        resent += len(copies)
        retries = [ids for ids in by_key.values() if len(ids) > 1]
        assert len(retries) == rollout.facts.retried_requests
        retried += len(retries)
    assert resent and retried


def test_responses_carry_token_sources_and_negative_logprobs(busy_events):
    sources = defaultdict(int)
    for event in busy_events:
        if event["type"] != "llm.response":
            continue
        payload = event["payload"]
        sources[payload["token_source"]] += 1
        if payload["token_source"] == "engine":
            assert len(payload["logprobs"]) == len(payload["response_token_ids"])
            assert max(payload["logprobs"]) < 0
        elif payload["token_source"] == "none":
            assert payload["response_token_ids"] is None and payload["logprobs"] is None
    assert set(sources) == {"engine", "retokenized", "none"}
    assert sources["engine"] > sources["retokenized"] + sources["none"]


def test_token_ids_stay_inside_the_vocabulary(busy_events):
    config = WorkloadConfig(**BUSY)
    for event in busy_events:
        ids = event["payload"].get("prompt_token_ids") or event["payload"].get("response_token_ids") or []
        assert all(0 < t < config.vocab_size for t in ids)


def test_identity_fields_come_from_the_config():
    config = WorkloadConfig(**{**SMALL, "tenants": ("acme", "globex"), "harness_versions": ("2.0",),
                               "policy_versions": ("p-9",)})
    events = list(generate_events(config))
    assert {e["tenant"] for e in events} <= {"acme", "globex"}
    assert {e["harness"]["version"] for e in events} == {"2.0"}
    assert {e["payload"]["policy_version"] for e in events if e["type"] == "rollout.started"} == {"p-9"}
    per_task = defaultdict(set)
    for e in events:
        per_task[e["task_id"]].add(e["rollout_id"])
    assert len(per_task) == 3 and all(len(r) == 3 for r in per_task.values())
    assert config.rollouts == sum(len(r) for r in per_task.values())


def test_events_stream_without_generating_everything_first(monkeypatch):
    made = []
    real = workload.simulate_rollout
    monkeypatch.setattr(workload, "simulate_rollout", lambda *a, **kw: made.append(1) or real(*a, **kw))
    stream = generate_events(WorkloadConfig(tasks=100_000, rollouts_per_task=8))
    first = [next(stream) for _ in range(50)]
    assert len(first) == 50 and len(made) < 10


@pytest.mark.parametrize("bad", [
    {"tasks": 0},
    {"tasks": "many"},
    {"rollouts_per_task": -1},
    {"min_calls": 10, "max_calls": 5},
    {"max_context_tokens": 10},
    {"subagent_rate": 1.5},
    {"drift_rate": -0.1},
    {"tenants": ()},
    {"vocab_size": 2**31},
    {"unknown_option": 1},
])
def test_bad_configs_are_refused_naming_the_option(bad):
    with pytest.raises(ValidationError) as exc:
        WorkloadConfig(**bad)
    assert any(option in str(exc.value) for option in bad)
