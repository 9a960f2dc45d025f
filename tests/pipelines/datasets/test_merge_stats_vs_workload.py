"""Merge statistics against the workload generator's ground truth (typed tables via the ingester's row code)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from devkit.workload import WorkloadConfig, generate_rollouts
from pipelines import build_dataset, read_dataset
from schemas.events import EVENT_ADAPTER
from schemas.tables import TYPED_TABLES
from store.event_rows import KafkaCoordinates, events_table, typed_tables

CONFIG = WorkloadConfig(tasks=6, rollouts_per_task=8, seed=3)


def test_merge_breaks_match_what_the_generator_did(lake):
    rollouts = list(generate_rollouts(CONFIG))
    events = {e["event_id"]: EVENT_ADAPTER.validate_python(e) for r in rollouts for e in r.events}  # resends dedupe
    table = events_table(list(events.values()), [KafkaCoordinates("t", 0, i) for i in range(len(events))])
    schemas = dict(TYPED_TABLES.values())
    for name, rows in typed_tables(table).items():
        lake.append(name, rows, schema=schemas[name])
    result = build_dataset(lake, "workload")
    facts = Counter()
    for r in rollouts:
        facts.update({k: getattr(r.facts, k) for k in ("llm_calls", "subagents", "summarisations", "drifts",
                                                      "retried_requests", "untokenized_calls")})
    samples = read_dataset(lake, "workload")
    reasons = Counter(samples["start_reason"].to_pylist())
    assert reasons["first"] == len(rollouts) + facts["subagents"]  # each agent context starts one sample
    assert reasons["retokenization"] == facts["drifts"]
    # a summarised prompt that carries no token ids is not trained, so its break is not seen
    assert facts["summarisations"] - facts["untokenized_calls"] <= reasons["truncation"] <= facts["summarisations"]
    assert reasons["other"] == reasons["chat_template"] == 0
    weights = np.array(samples["token_weight"].to_pylist(), np.float64) * np.array(samples["n_trained_tokens"])
    assert weights.sum() == pytest.approx(1.0, abs=1e-5)
    calls = result.manifest["counts"]["calls"]
    assert calls["duplicate"] == facts["retried_requests"]
    assert calls["ok"] + calls["non_engine"] == facts["llm_calls"]
