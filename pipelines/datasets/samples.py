"""Streaming the merged samples: batches of rollouts in, Arrow record batches out.

Rollouts are processed in rollout_id order in batches bounded by
``batch_tokens``, so memory follows one batch, not the dataset. The rows pass
through a running SHA-256 (the content hash: config identity + every row in
(rollout_id, sample_index) order) and the merge statistics on their way to
the dataset writer. With ``mask="observations"`` the loss mask sits on the
observation tokens instead and samples without one are not written (rules
in ``pipelines.datasets.observations``).
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa

from pipelines.datasets.calls import BatchTokens, TokenTables, iter_batches, read_ahead
from pipelines.datasets.config import BuildConfig
from pipelines.datasets.merging import MISMATCH_CLASSES, Call, Sample, merge_calls, tokenizer_decoders
from schemas.tables import SAMPLES
from schemas.errors import DataError
from store.prompts import StoredCall, full_prompts


@dataclass(frozen=True)
class RolloutPlan:
    """The rollouts to merge, sorted by rollout_id, with their scalars."""

    rollout_ids: list[str]
    task_ids: list[str]
    tenants: list[str]
    group_ids: list[str]
    policy_versions: list[str | None]
    rewards: np.ndarray
    advantages: np.ndarray
    token_weights: np.ndarray
    trained_tokens: np.ndarray
    read_tokens: np.ndarray
    reward_event_ids: list[list[str]]

    @classmethod
    def from_table(cls, table: pa.Table) -> RolloutPlan:
        col = lambda name: table[name].to_pylist()  # noqa: E731
        return cls(
            rollout_ids=col("rollout_id"),
            task_ids=col("task_id"),
            tenants=col("tenant"),
            group_ids=col("group_id"),
            policy_versions=col("policy_version"),
            rewards=table["reward"].to_numpy(),
            advantages=table["advantage"].to_numpy(),
            token_weights=table["token_weight"].to_numpy(),
            trained_tokens=table["trained_tokens"].to_numpy(),
            read_tokens=table["read_tokens"].to_numpy(),
            reward_event_ids=col("reward_event_ids"),
        )


class SampleStream:
    """Merges the plan's rollouts batch by batch; ``batches()`` feeds the dataset writer once."""

    def __init__(
        self,
        con: duckdb.DuckDBPyConnection,
        tables: TokenTables,
        plan: RolloutPlan,
        config: BuildConfig,
        *,
        progress: Callable[[int, int], None] | None = None,
    ) -> None:
        self._con, self._tables, self._plan, self._config, self._progress = con, tables, plan, config, progress
        self._index = {rollout_id: i for i, rollout_id in enumerate(plan.rollout_ids)}
        self._observations = config.mask == "observations"
        self._decoders = tokenizer_decoders(config.tokenizers)
        self._hash = hashlib.sha256(json.dumps(config.identity(), sort_keys=True).encode())
        self.samples_per_rollout: dict[str, int] = {}
        self.start_reasons: Counter[str] = Counter()
        self.n_samples = self.n_tokens = self.n_trained_tokens = 0
        self.n_without_observations = 0
        """Samples not written in observation mode: they never grew past their first prompt."""

    def content_hash(self) -> str:
        return self._hash.hexdigest()

    def merge_statistics(self) -> dict:
        counts = np.array(list(self.samples_per_rollout.values()) or [0])
        histogram = Counter(int(c) for c in counts)
        return {
            "samples_per_rollout_mean": round(float(counts.mean()), 4),
            "samples_per_rollout_max": int(counts.max()),
            "samples_per_rollout_histogram": {str(k): v for k, v in sorted(histogram.items())},
            "single_sample_share": round(float((counts == 1).mean()), 4),
            "mismatches": {cls: self.start_reasons.get(cls, 0) for cls in MISMATCH_CLASSES},
        }

    def batches(self) -> Iterator[pa.RecordBatch]:
        """The samples as record batches of ``SAMPLES``, one per batch of rollouts; iterate once."""
        plan, done = self._plan, 0
        batches = iter_batches(plan.rollout_ids, plan.read_tokens.tolist(), self._config.batch_tokens)
        for batch, tokens in read_ahead(self._con, self._tables, batches):
            rows: list[tuple[int, int, Sample]] = []
            for rollout_id, calls in calls_by_rollout(tokens):
                i = self._index[rollout_id]
                samples = merge_calls(calls, decoders=self._decoders)
                self._check_counts(rollout_id, samples, int(plan.trained_tokens[i]))
                written = [(i, k, s) for k, s in enumerate(samples) if not self._observations or s.n_observed]
                self.n_without_observations += len(samples) - len(written)
                self.samples_per_rollout[rollout_id] = len(written)
                rows.extend(written)
            yield self._record_batch(rows)
            del tokens, rows
            pa.default_memory_pool().release_unused()
            done += len(batch)
            if self._progress is not None:
                self._progress(done, len(plan.rollout_ids))

    def _record_batch(self, rows: list[tuple[int, int, Sample]]) -> pa.RecordBatch:
        """The rows as one record batch; token columns filled in place (one buffer per column, no copies)."""
        plan = self._plan
        lengths = np.array([len(sample.tokens) for _, _, sample in rows], dtype=np.int64)
        offsets = np.concatenate(([0], np.cumsum(lengths)))
        ids = np.empty(offsets[-1], dtype=np.int32)
        masks, logprobs = np.zeros(offsets[-1], dtype=np.int8), np.zeros(offsets[-1], dtype=np.float32)
        trained = []
        for j, (i, k, sample) in enumerate(rows):
            row = slice(offsets[j], offsets[j + 1])
            sample.fill(ids[row], masks[row], logprobs[row], observations=self._observations)
            trained.append(sample.n_observed if self._observations else sample.n_trained)
            self.start_reasons[sample.start_reason] += 1
            self._hash_row(plan.rollout_ids[i], k, sample, ids[row], masks[row], logprobs[row], i)
        list_offsets = pa.array(offsets.astype(np.int32))
        rollout = [i for i, _, _ in rows]
        self.n_samples += len(rows)
        self.n_tokens += int(lengths.sum())
        self.n_trained_tokens += sum(trained)
        return pa.RecordBatch.from_arrays(
            [
                pa.array([f"{plan.rollout_ids[i]}/{k}" for i, k, _ in rows], pa.string()),
                pa.array([plan.tenants[i] for i in rollout], pa.string()),
                pa.array([plan.task_ids[i] for i in rollout], pa.string()),
                pa.array([plan.rollout_ids[i] for i in rollout], pa.string()),
                pa.array([plan.group_ids[i] for i in rollout], pa.string()),
                pa.array([k for _, k, _ in rows], pa.int32()),
                pa.array([s.start_reason for _, _, s in rows], pa.string()),
                pa.array([s.call_ids for _, _, s in rows], pa.list_(pa.string())),
                pa.array([s.policy_version or plan.policy_versions[i] for i, _, s in rows], pa.string()),
                pa.array([s.tokenizer for _, _, s in rows], pa.string()),
                pa.ListArray.from_arrays(list_offsets, pa.array(ids)),
                pa.ListArray.from_arrays(list_offsets, pa.array(masks)),
                pa.ListArray.from_arrays(list_offsets, pa.array(logprobs)),
                pa.array(plan.advantages[rollout], pa.float32()),
                pa.array(plan.token_weights[rollout], pa.float32()),
                pa.array(plan.rewards[rollout], pa.float64()),
                pa.array(lengths, pa.int32()),
                pa.array(trained, pa.int32()),
            ],
            schema=SAMPLES,
        )

    def _check_counts(self, rollout_id: str, samples: list[Sample], planned: int) -> None:
        """The weights were planned from n_response_tokens: the token lists must agree."""
        actual = sum(s.n_trained for s in samples)
        if actual != planned:
            raise CorruptTable(
                f"rollout {rollout_id}: llm_responses.n_response_tokens sums to {planned} but the response "
                f"token lists hold {actual} tokens: rebuild the typed tables from events (trajlake rebuild)"
            )

    def _hash_row(self, rollout_id: str, k: int, sample: Sample, ids: np.ndarray, mask: np.ndarray,
                  lps: np.ndarray, i: int) -> None:
        plan = self._plan
        head = [rollout_id, k, sample.start_reason, sample.call_ids, sample.policy_version or plan.policy_versions[i],
                sample.tokenizer, float(np.float32(plan.advantages[i])), float(np.float32(plan.token_weights[i])),
                float(plan.rewards[i])]
        self._hash.update(json.dumps(head).encode())
        for array in (ids, mask, lps):
            self._hash.update(len(array).to_bytes(8, "little"))
            self._hash.update(np.ascontiguousarray(array).data)  # the bytes tobytes() gave, without the copy


class CorruptTable(DataError):
    """A source table's scalar summaries disagree with its token lists."""


def calls_by_rollout(batch: BatchTokens) -> Iterator[tuple[str, list[Call]]]:
    """Group a batch's calls (sorted by rollout, seq) into ``Call`` lists, tokens as numpy views."""
    calls = batch.calls
    if calls.num_rows == 0:
        return
    requests = _RowsById(batch.requests, scalars=("span_id", "tokenizer", "chat_template_hash"),
                         lists=("prompt_token_ids",))
    responses = _RowsById(batch.responses, scalars=("policy_version",), lists=("response_token_ids", "logprobs"))
    rollout_ids, call_ids = calls["rollout_id"].to_pylist(), calls["call_id"].to_pylist()
    req_ids, resp_ids = calls["req_event_id"].to_pylist(), calls["resp_event_id"].to_pylist()
    linked = _links_by_rollout(batch.links)
    start = 0
    for end in range(1, len(rollout_ids) + 1):
        if end == len(rollout_ids) or rollout_ids[end] != rollout_ids[start]:
            links = linked.get(rollout_ids[start])
            prompts = _full_prompts(links, requests, responses) if links else {}
            group = []
            for i in range(start, end):
                q, r = requests.row(req_ids[i]), responses.row(resp_ids[i])
                group.append(Call(call_id=call_ids[i], span_id=q["span_id"], tokenizer=q["tokenizer"],
                                  chat_template_hash=q["chat_template_hash"],
                                  prompt=prompts.get(call_ids[i], q["prompt_token_ids"]),
                                  response=r["response_token_ids"], logprobs=r["logprobs"],
                                  policy_version=r["policy_version"]))
            yield rollout_ids[start], group
            start = end


def _links_by_rollout(links: pa.Table) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for row in links.to_pylist():
        out.setdefault(row["rollout_id"], []).append(row)
    return out


def _full_prompts(links: list[dict[str, Any]], requests: _RowsById, responses: _RowsById) -> dict[str, np.ndarray]:
    """Full prompt ids of a rollout's calls, prefix references resolved (``call_index`` checked that the ok
    calls' chains resolve, on the token counts; a list that disagrees is a corrupt table)."""
    stored = [StoredCall(link["call_id"], requests.row(link["req_event_id"])["prompt_token_ids"],
                         responses.row(link["resp_event_id"])["response_token_ids"] if link["resp_event_id"] else None,
                         link["extends_call_id"], link["extends_tokens"]) for link in links]
    prompts, problems = full_prompts(stored)
    if problems:
        raise CorruptTable(
            f"prefix references of calls {sorted(problems)} do not resolve on their token lists although the "
            "token counts say they do: rebuild the typed tables from events (trajlake rebuild)")
    return prompts


class _RowsById:
    """A table's rows by event_id; list columns as zero-copy numpy slices of their own record batch.

    No chunk is combined: a batch's rows come from several decoded files, and
    combining them copied every token list once more.
    """

    def __init__(self, table: pa.Table, *, scalars: tuple[str, ...], lists: tuple[str, ...]) -> None:
        self._batches: list[dict[str, Callable[[int], object]]] = []
        self._where: dict[str, tuple[int, int]] = {}
        for b, batch in enumerate(table.to_batches()):
            columns: dict[str, Callable[[int], object]] = {n: batch.column(n).to_pylist().__getitem__ for n in scalars}
            columns.update({n: _list_views(batch.column(n)) for n in lists})
            self._batches.append(columns)
            self._where.update((event_id, (b, j)) for j, event_id in enumerate(batch.column("event_id").to_pylist()))

    def row(self, event_id: str) -> dict[str, object]:
        b, j = self._where[event_id]
        return {name: value(j) for name, value in self._batches[b].items()}


def _list_views(array: pa.ListArray) -> Callable[[int], np.ndarray | None]:
    """Row j of a list array as a zero-copy numpy slice (None when null)."""
    offsets = array.offsets.to_numpy()
    values = array.values.to_numpy(zero_copy_only=False)
    valid = array.is_valid().to_numpy(zero_copy_only=False)
    return lambda j: values[offsets[j] : offsets[j + 1]] if valid[j] else None
