"""Observation-prediction samples (``BuildConfig(mask="observations")``).

Rollouts already paid for can also teach the model to predict its
environment. An observation dataset holds the same merged samples as an
action dataset, with the loss mask moved:

- ``loss_mask`` is 1 on the observation tokens: every token a call's prompt
  adds after the tokens its sample already holds (the previous prompt plus
  the sampled response). That is exactly what the harness appended between
  one response's end and the next prompt's end: the tool result (or user
  message), and the chat-template tokens around it, e.g. in ChatML
  ``\\n<|im_start|>tool\\n{result}<|im_end|>\\n<|im_start|>assistant\\n``.
  The wrapper tokens count because the model did not sample them and the
  rule needs no knowledge of the template; they are near-certain to predict
  and add little loss.
- 0 on sampled action tokens and on a sample's first prompt: the
  system/task text is the problem statement, not a consequence of an action.
  A sample that never grew past its first call has no observation and is
  left out (the trainer refuses rows without a masked token); the others
  keep their ``sample_index``, so ``sample_id`` pairs them with the rows of an
  action dataset built from the same config.
- ``old_logprobs`` are 0 (the engine never scored observations), and
  ``advantage`` is 0 for every rollout: the rows are for SFT (masked NLL),
  and a policy-gradient step on them moves nothing.
- ``token_weight`` is the rollout-level token mean over the observation
  tokens, 1 / (R x O_r) with O_r a rollout's observation tokens and R the
  rollouts with O_r > 0, so the dataset's weights again sum to 1. O_r is
  only known after merging, so the build merges twice (a counting pass,
  then the writing pass); rollouts with O_r = 0 are left out and counted
  under ``without_trained_tokens``.

Selection, reward rule and lineage are those of any dataset; the mode is
part of the config, so it enters the manifest and the content hash.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pyarrow as pa

from pipelines.datasets.calls import CallRows, TokenTables, iter_batches, read_ahead
from pipelines.datasets.merging import merge_calls
from pipelines.datasets.samples import calls_by_rollout


def observed_tokens_per_rollout(
    rows: CallRows,
    tables: TokenTables,
    rollout_ids: list[str],
    read_tokens: list[int],
    *,
    batch_tokens: int,
    progress: Callable[[int, int], None] | None = None,
) -> np.ndarray:
    """Observation tokens of each rollout (in ``rollout_ids`` order, sorted ids): the counting pass."""
    index = {rollout_id: i for i, rollout_id in enumerate(rollout_ids)}
    counts = np.zeros(len(rollout_ids), dtype=np.int64)
    done = 0
    for batch, tokens in read_ahead(rows, tables, iter_batches(rollout_ids, read_tokens, batch_tokens)):
        for rollout_id, calls in calls_by_rollout(tokens):
            counts[index[rollout_id]] = sum(s.n_observed for s in merge_calls(calls))
        done += len(batch)
        if progress is not None:
            progress(done, len(rollout_ids))
    return counts


def with_observed_tokens(
    rows: CallRows,
    tables: TokenTables,
    rollouts: pa.Table,
    *,
    batch_tokens: int,
    progress: Callable[[int, int], None] | None = None,
) -> pa.Table:
    """``rollouts`` (sorted by rollout_id, with read_tokens) plus ``observed_tokens``, those without any left out."""
    counts = observed_tokens_per_rollout(rows, tables, rollouts["rollout_id"].to_pylist(),
                                         rollouts["read_tokens"].to_pylist(), batch_tokens=batch_tokens,
                                         progress=progress)
    rollouts = rollouts.append_column("observed_tokens", pa.array(counts, pa.int64()))
    return rollouts.filter(pa.array(counts > 0))
