"""Streaming the merged samples: batches of rollouts in, Arrow record batches out.

Rollouts are processed in rollout_id order in batches bounded by
``batch_tokens``, so memory follows one batch, not the dataset. The rows pass
through the merge statistics on their way to the dataset writer (which feeds
them to the content hash, ``pipelines.datasets.content_hash``). With ``mask="observations"`` the loss mask sits on the
observation tokens instead and samples without one are not written (rules
in ``pipelines.datasets.observations``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipelines.datasets.calls import BatchTokens, CallRows, TokenTables, iter_batches, read_ahead
from pipelines.datasets.config import BuildConfig
from pipelines.datasets.merging import MISMATCH_CLASSES, Call, Sample, merge_calls, sample_arrays, tokenizer_decoders
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
        rows: CallRows,
        tables: TokenTables,
        plan: RolloutPlan,
        config: BuildConfig,
        *,
        progress: Callable[[int, int], None] | None = None,
    ) -> None:
        self._rows, self._tables, self._plan, self._config, self._progress = rows, tables, plan, config, progress
        self._index = {rollout_id: i for i, rollout_id in enumerate(plan.rollout_ids)}
        self._observations = config.mask == "observations"
        self._decoders = tokenizer_decoders(config.tokenizers)
        self.samples_per_rollout: dict[str, int] = {}
        self.start_reasons: Counter[str] = Counter()
        self.n_samples = self.n_tokens = self.n_trained_tokens = 0
        self.n_without_observations = 0
        """Samples not written in observation mode: they never grew past their first prompt."""

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
        for batch, tokens in read_ahead(self._rows, self._tables, batches):
            rows = self._merge(tokens)
            del tokens  # the input and the merged samples are freed before the output is encoded
            record = self._record_batch(rows)
            del rows
            pa.default_memory_pool().release_unused()
            yield record
            done += len(batch)
            if self._progress is not None:
                self._progress(done, len(plan.rollout_ids))

    def _merge(self, tokens: BatchTokens) -> list[tuple[int, int, Sample]]:
        """(plan index, sample index, sample) of the batch's rollouts, in rollout order."""
        rows: list[tuple[int, int, Sample]] = []
        for rollout_id, calls in calls_by_rollout(tokens):
            i = self._index[rollout_id]
            samples = merge_calls(calls, decoders=self._decoders)
            self._check_counts(rollout_id, samples, int(self._plan.trained_tokens[i]))
            written = [(i, k, s) for k, s in enumerate(samples) if not self._observations or s.n_observed]
            self.n_without_observations += len(samples) - len(written)
            self.samples_per_rollout[rollout_id] = len(written)
            rows.extend(written)
        return rows

    def _record_batch(self, rows: list[tuple[int, int, Sample]]) -> pa.RecordBatch:
        """The rows as one record batch; token columns laid out by ``sample_arrays`` (one buffer per column)."""
        plan = self._plan
        laid = sample_arrays([sample for _, _, sample in rows], observations=self._observations)
        self.start_reasons.update(sample.start_reason for _, _, sample in rows)
        list_offsets = pa.array(laid.offsets.astype(np.int32))
        rollout = [i for i, _, _ in rows]
        lengths = np.diff(laid.offsets)
        self.n_samples += len(rows)
        self.n_tokens += int(lengths.sum())
        self.n_trained_tokens += int(laid.marked.sum())
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
                pa.ListArray.from_arrays(list_offsets, pa.array(laid.ids)),
                pa.ListArray.from_arrays(list_offsets, pa.array(laid.mask)),
                pa.ListArray.from_arrays(list_offsets, pa.array(laid.logprobs)),
                pa.array(plan.advantages[rollout], pa.float32()),
                pa.array(plan.token_weights[rollout], pa.float32()),
                pa.array(plan.rewards[rollout], pa.float64()),
                pa.array(lengths, pa.int32()),
                pa.array(laid.marked, pa.int32()),
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


class CorruptTable(DataError):
    """A source table's scalar summaries disagree with its token lists."""


def calls_by_rollout(batch: BatchTokens) -> Iterator[tuple[str, list[Call]]]:
    """Group a batch's calls (sorted by rollout, seq) into ``Call`` lists, tokens as numpy views.

    Every call's token rows are found in one lookup per table (``pc.index_in`` on event_id) and its
    scalars taken in one ``take`` per column; the ``Call`` objects are made in one ``map`` over the columns
    (positional: keyword construction per call took a quarter of the grouping) and sliced by rollout.
    """
    calls = batch.calls
    if calls.num_rows == 0:
        return
    requests, responses = _TokenRows(batch.requests), _TokenRows(batch.responses)
    q, r = requests.find(calls["req_event_id"]), responses.find(calls["resp_event_id"])
    prompts = requests.cells("prompt_token_ids", q)
    spans, tokenizers, templates = (requests.scalars(name, q) for name in ("span_id", "tokenizer",
                                                                              "chat_template_hash"))
    answers, logprobs = responses.cells("response_token_ids", r), responses.cells("logprobs", r)
    policies = responses.scalars("policy_version", r)
    rollout_ids, call_ids = calls["rollout_id"].to_pylist(), calls["call_id"].to_pylist()
    resolved = _full_prompts(batch.links, requests, responses)
    if resolved:
        prompts = [resolved[rollout].get(call, prompt) if rollout in resolved else prompt
                   for rollout, call, prompt in zip(rollout_ids, call_ids, prompts)]
    made = list(map(Call, call_ids, spans, tokenizers, templates, prompts, answers, logprobs, policies))
    runs = pc.run_end_encode(calls["rollout_id"].combine_chunks())
    start = 0
    for rollout_id, end in zip(runs.values.to_pylist(), runs.run_ends.to_pylist()):
        yield rollout_id, made[start:end]
        start = end


def _full_prompts(links: pa.Table, requests: _TokenRows, responses: _TokenRows) -> dict[str, dict[str, np.ndarray]]:
    """rollout_id -> full prompt ids of its calls, prefix references resolved (``call_index`` checked that the
    ok calls' chains resolve, on the token counts; a list that disagrees is a corrupt table)."""
    if links.num_rows == 0:
        return {}
    prompts = requests.cells("prompt_token_ids", requests.find(links["req_event_id"]))
    answers = responses.cells("response_token_ids", responses.find(links["resp_event_id"]))
    by_rollout: dict[str, list[StoredCall]] = {}
    for j, link in enumerate(links.select(["rollout_id", "call_id", "extends_call_id", "extends_tokens"]).to_pylist()):
        by_rollout.setdefault(link["rollout_id"], []).append(
            StoredCall(link["call_id"], prompts[j], answers[j], link["extends_call_id"], link["extends_tokens"]))
    out = {}
    for rollout_id, stored in by_rollout.items():
        out[rollout_id], problems = full_prompts(stored)
        if problems:
            raise CorruptTable(
                f"prefix references of calls {sorted(problems)} do not resolve on their token lists although the "
                "token counts say they do: rebuild the typed tables from events (trajlake rebuild)")
    return out


class _TokenRows:
    """A batch's token table, looked up by event_id for many calls at once; list cells as zero-copy numpy views.

    No chunk is combined: a batch's rows come from several decoded files, and
    combining them copied every token list once more. A missing event_id
    (a null one, e.g. a link without a response) is row -1, whose cells are None.
    """

    def __init__(self, table: pa.Table) -> None:
        self._table = table
        self._event_ids = table["event_id"].combine_chunks()

    def find(self, event_ids: pa.ChunkedArray) -> np.ndarray:
        rows = pc.index_in(event_ids, value_set=self._event_ids)
        return pc.fill_null(rows, -1).to_numpy().astype(np.int64)

    def scalars(self, name: str, rows: np.ndarray) -> list[object]:
        found = np.maximum(rows, 0)
        values = self._table[name].take(pa.array(found)).to_pylist() if len(self._table) else [None] * len(rows)
        if len(rows) == 0 or rows.min() >= 0:
            return values
        return [v if row >= 0 else None for v, row in zip(values, rows.tolist())]

    def cells(self, name: str, rows: np.ndarray) -> list[np.ndarray | None]:
        out: list[np.ndarray | None] = [None] * len(rows)
        first = 0
        for chunk in self._table[name].chunks:
            picked = np.flatnonzero((rows >= first) & (rows < first + len(chunk)))
            if len(picked):
                local = rows[picked] - first
                offsets = chunk.offsets.to_numpy()
                values = chunk.values.to_numpy(zero_copy_only=False)
                valid = chunk.is_valid().to_numpy(zero_copy_only=False)[local].tolist()
                for j, a, b, ok in zip(picked.tolist(), offsets[local].tolist(), offsets[local + 1].tolist(), valid):
                    if ok:
                        out[j] = values[a:b]
            first += len(chunk)
        return out
