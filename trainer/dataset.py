"""Load one dataset version (Delta time travel) and check it is trainable.

Rows follow ``schemas.tables.SAMPLES``. Everything is checked before a model
is touched: column types, equal list lengths per row, token ids inside the
model's vocabulary, a 0/1 loss mask, finite advantages/weights/logprobs and a
length the model can take. A bad row fails the whole version with the
offending ``sample_id`` named: silently dropping training data hides bugs
upstream.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from schemas.tables import SAMPLES, dataset_table
from store.lake import Lake, TableMissing
from trainer.errors import DatasetError

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
COLUMNS = [
    "sample_id", "rollout_id", "tokenizer", "input_ids", "loss_mask",
    "old_logprobs", "advantage", "token_weight", "reward",
]  # fmt: skip
LOGPROB_SLACK = 1e-3  # engines round; a logprob a hair above 0 is still a probability of 1


@dataclass(frozen=True)
class DatasetRef:
    """``NAME@VERSION``; version None means the latest."""

    name: str
    version: int | None = None

    @classmethod
    def parse(cls, spec: str) -> DatasetRef:
        """>>> DatasetRef.parse("math@3")
        DatasetRef(name='math', version=3)
        """
        name, sep, ver = spec.partition("@")
        if not NAME_RE.match(name):
            raise DatasetError(f"bad dataset name {name!r}: use letters, digits, '_', '.', '-' (e.g. math@3)")
        if not sep:
            return cls(name)
        if not ver.isdigit():
            raise DatasetError(f"bad dataset version {ver!r} in {spec!r}: write NAME@VERSION with VERSION >= 0")
        return cls(name, int(ver))

    @property
    def table(self) -> str:
        return dataset_table(self.name)


@dataclass(frozen=True)
class Samples:
    """A checked dataset version, one numpy array per row for the token columns."""

    name: str
    version: int
    sample_ids: list[str]
    rollout_ids: list[str]
    input_ids: list[np.ndarray]
    loss_mask: list[np.ndarray]
    old_logprobs: list[np.ndarray]
    advantage: np.ndarray
    token_weight: np.ndarray
    reward: np.ndarray
    tokenizers: list[str]
    """Distinct tokenizer identities of the rows (nulls left out)."""

    def __len__(self) -> int:
        return len(self.sample_ids)

    @property
    def n_tokens(self) -> int:
        return int(sum(len(x) for x in self.input_ids))

    def select(self, keep: np.ndarray) -> Samples:
        """The rows where ``keep`` is true (e.g. positive rollouts for SFT)."""
        idx = np.flatnonzero(keep)
        pick = lambda xs: [xs[i] for i in idx]  # noqa: E731
        return Samples(
            self.name, self.version, pick(self.sample_ids), pick(self.rollout_ids), pick(self.input_ids),
            pick(self.loss_mask), pick(self.old_logprobs), self.advantage[idx], self.token_weight[idx],
            self.reward[idx], self.tokenizers,
        )  # fmt: skip


def resolve_version(lake: Lake, ref: DatasetRef) -> int:
    """The Delta version ``ref`` names (the latest when it names none)."""
    latest = lake.version(ref.table)
    if latest is None:
        raise DatasetError(f"dataset {ref.name!r} does not exist in lake {lake.root}: build it first (trajlake build-dataset)")
    if ref.version is None:
        return latest
    if ref.version > latest:
        raise DatasetError(f"dataset {ref.name!r} has no version {ref.version}: the latest is {latest}")
    return ref.version


def loss_mask_mode(lake: Lake, ref: DatasetRef, version: int) -> str:
    """What the dataset's loss mask covers: ``actions`` (sampled tokens) or ``observations``.

    Read from the build's manifest; a dataset written without the registry
    (by hand, by another tool) is taken to mask actions.
    """
    from pipelines.datasets.registry import DatasetNotFound, get_manifest

    try:
        return get_manifest(lake, ref.name, version).get("mask") or "actions"
    except DatasetNotFound:
        return "actions"


def load_samples(lake: Lake, ref: DatasetRef, *, vocab_size: int, max_len: int) -> Samples:
    """Read ``datasets/NAME`` at its version and check every row (see module doc)."""
    version = resolve_version(lake, ref)
    try:
        raw = lake.read(ref.table, version=version)
    except TableMissing:
        raise DatasetError(f"dataset {ref.name!r} does not exist in lake {lake.root}") from None
    except Exception as exc:  # deltalake raises bare exceptions for vacuumed or corrupt versions
        raise DatasetError(f"cannot read dataset {ref.name}@{version}: {exc}") from exc
    table = _typed(raw, ref.name, version)
    _check_rows(table, vocab_size=vocab_size, max_len=max_len, where=f"{ref.name}@{version}")
    col = lambda c: table.column(c).combine_chunks()  # noqa: E731
    return Samples(
        name=ref.name,
        version=version,
        sample_ids=col("sample_id").to_pylist(),
        rollout_ids=col("rollout_id").to_pylist(),
        input_ids=_split(col("input_ids"), np.int64),
        loss_mask=_split(col("loss_mask"), np.float32),
        old_logprobs=_split(col("old_logprobs"), np.float32),
        advantage=col("advantage").to_numpy().astype(np.float32),
        token_weight=col("token_weight").to_numpy().astype(np.float32),
        reward=col("reward").to_numpy().astype(np.float64),
        tokenizers=sorted({t for t in col("tokenizer").to_pylist() if t}),
    )


def _typed(raw: pa.Table, name: str, version: int) -> pa.Table:
    """The columns the trainer reads, cast to the SAMPLES types."""
    missing = [c for c in COLUMNS if c not in raw.column_names]
    if missing:
        raise DatasetError(f"dataset {name}@{version} lacks columns {missing}: it was not built as SAMPLES rows")
    if raw.num_rows == 0:
        raise DatasetError(f"dataset {name}@{version} has no rows: nothing to train on")
    fields = [SAMPLES.field(c) for c in COLUMNS]
    out = []
    for f in fields:
        try:
            column = raw.column(f.name).cast(f.type)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
            raise DatasetError(
                f"dataset {name}@{version} column {f.name} has type {raw.schema.field(f.name).type}, "
                f"expected {f.type}: {exc}"
            ) from None
        if not f.nullable and column.null_count:
            raise DatasetError(f"dataset {name}@{version} column {f.name} has {column.null_count} null values")
        out.append(column)
    return pa.table(out, names=COLUMNS)


def _check_rows(t: pa.Table, *, vocab_size: int, max_len: int, where: str) -> None:
    """Vectorised per-row checks; the first failing row is named."""
    ids, mask, lps = (t.column(c).combine_chunks() for c in ("input_ids", "loss_mask", "old_logprobs"))
    lens = pc.list_value_length(ids).to_numpy(zero_copy_only=False)
    problems: list[tuple[np.ndarray, str]] = [
        (lens < 2, "fewer than 2 tokens"),
        (lens > max_len, f"longer than {max_len} tokens (the model's limit; raise --max-seq-len or rebuild shorter)"),
        (pc.list_value_length(mask).to_numpy(zero_copy_only=False) != lens, "loss_mask length != input_ids length"),
        (pc.list_value_length(lps).to_numpy(zero_copy_only=False) != lens, "old_logprobs length != input_ids length"),
    ]
    row_of = np.repeat(np.arange(len(lens)), lens)
    flat_ids = ids.flatten().to_numpy(zero_copy_only=False)
    _flag(problems, row_of, (flat_ids < 0) | (flat_ids >= vocab_size), f"token id outside the vocabulary [0, {vocab_size})", len(lens))
    if not problems[2][0].any():
        flat_mask = mask.flatten().to_numpy(zero_copy_only=False)
        _flag(problems, row_of, (flat_mask != 0) & (flat_mask != 1), "loss_mask value other than 0/1", len(lens))
        if not problems[3][0].any():
            flat_lp = lps.flatten().to_numpy(zero_copy_only=False)
            bad_lp = (flat_mask == 1) & ~(np.isfinite(flat_lp) & (flat_lp <= LOGPROB_SLACK))
            _flag(problems, row_of, bad_lp, "old_logprobs not a finite log-probability on a masked token", len(lens))
            trained = np.zeros(len(lens), dtype=bool)
            np.logical_or.at(trained, row_of, flat_mask == 1)
            problems.append((~trained, "no token with loss_mask 1"))
    for c in ("advantage", "token_weight"):
        v = t.column(c).to_numpy()
        problems.append((~np.isfinite(v), f"{c} not finite"))
    problems.append((t.column("token_weight").to_numpy() < 0, "token_weight negative"))
    sample_ids = t.column("sample_id")
    for bad, what in problems:
        if bad.any():
            first = int(np.flatnonzero(bad)[0])
            raise DatasetError(
                f"dataset {where}: {int(bad.sum())} row(s) with {what}, first sample_id={sample_ids[first].as_py()!r}; "
                "fix the build (trajlake build-dataset) and train the new version"
            )


def _flag(problems: list, row_of: np.ndarray, bad_token: np.ndarray, what: str, n_rows: int) -> None:
    rows = np.zeros(n_rows, dtype=bool)
    rows[row_of[bad_token]] = True
    problems.append((rows, what))


def _split(column: pa.Array, dtype: type) -> list[np.ndarray]:
    flat = column.flatten().to_numpy(zero_copy_only=False).astype(dtype)
    offsets = column.offsets.to_numpy()
    offsets = offsets - offsets[0]
    return [flat[offsets[i] : offsets[i + 1]] for i in range(len(column))]
