"""Token arrays of a batch decoded straight into Arrow, without a Python object per token id.

``schemas.fast`` decodes a 4 KB workload event in ~19 us, but its ~490 token
ids become Python ints (~12 us) that ``events_table`` then converts to Arrow
lists (~13-25 us): the largest cost per event left. Here the LLM payloads'
token fields are read as ``msgspec.Raw`` (msgspec still checks that they are
well-formed JSON, no Python objects made), and all the batch's slices are
parsed in one C pass per column into flat NumPy arrays, then wrapped as
Arrow ``list<int32>`` / ``list<float32>`` columns, one row per input value.

What the contract says about those fields is checked on the slices and the
parsed arrays: an array (or null); token ids only digits (JSON integers >= 0)
and <= INT32_MAX; logprobs plain numbers, finite; one logprob per response
token; ``token_source="engine"`` has ids. Logprobs in the compact form (a
base64 float32 string, ``schemas.compact_logprobs``) are decoded straight
into the column. An event whose token fields fail any
of these checks is refused here (None) and takes the per-event path
(``schemas.fast.decode_batch``, then the pydantic contract), which accepts it
or names the problem. ``tests/schemas/test_fast_tokens.py`` holds this path
to the contract's rows and verdicts.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from schemas import compact_logprobs, fast
from schemas.events import INT32_MAX, reference_problem
from schemas.tables import LOGPROBS, TOKENS
from schemas.versions import MAX_EVENT_BYTES

_WHITESPACE = b" \t\n\r"
_ID_BYTES = b"0123456789,"
_NUMBER_BYTES = b"0123456789,.-+eE"
_NULL = b"null"


class _RawLlmRequest(fast.LlmRequest, kw_only=True):
    prompt_token_ids: msgspec.Raw = None

    def __post_init__(self) -> None:
        """The reference rules of ``fast.LlmRequest``, with null ids read from the raw slice."""
        if self.extends_call_id is not None or self.extends_tokens is not None or self.extends_messages is not None \
                or self.extends_tools is not None:
            sent = self.prompt_token_ids is not None and bytes(self.prompt_token_ids) != _NULL
            problem = reference_problem(self, ids_sent=sent)
            if problem:
                raise ValueError(problem)


class _RawLlmResponse(fast.LlmResponse, kw_only=True):
    response_token_ids: msgspec.Raw = None
    logprobs: msgspec.Raw = None

    def __post_init__(self) -> None:
        """The length and ``engine`` rules are checked on the parsed arrays (``_TokenSlices``)."""


class _RawLlmRequestEvent(fast.LlmRequestEvent, kw_only=True, tag="llm.request"):
    type: ClassVar[str] = "llm.request"
    payload: _RawLlmRequest


class _RawLlmResponseEvent(fast.LlmResponseEvent, kw_only=True, tag="llm.response"):
    type: ClassVar[str] = "llm.response"
    payload: _RawLlmResponse


_TOKEN_FIELDS = {_RawLlmRequestEvent: ("prompt_token_ids", None), _RawLlmResponseEvent: ("response_token_ids", "logprobs")}
_DECODER = msgspec.json.Decoder(
    _RawLlmRequestEvent | _RawLlmResponseEvent | fast.RolloutStartedEvent | fast.RolloutFinishedEvent
    | fast.ToolCallEvent | fast.ToolResultEvent | fast.RewardEvent
)


@dataclass(frozen=True)
class TokenColumns:
    """The batch's token columns, one row per decoded value (null where it has none or was refused)."""

    ids: pa.Array
    """list<int32>"""
    logprobs: pa.Array
    """list<float32>"""

    def pick(self, sources: Sequence[int | tuple[list[int] | None, list[float] | None]]) -> tuple[pa.Array, pa.Array]:
        """(token_ids, logprobs) columns for rows in order: a row of this batch, or (ids, logprobs) lists of an
        event decoded one by one."""
        lists = [s for s in sources if not isinstance(s, int)]
        if not lists:
            rows = pa.array(sources, pa.int64())
            return self.ids.take(rows), self.logprobs.take(rows)
        n, extra = len(self.ids), iter(range(len(self.ids), len(self.ids) + len(lists)))
        rows = pa.array([s if isinstance(s, int) else next(extra) for s in sources], pa.int64())
        ids = pa.concat_arrays([self.ids, pa.array([i for i, _ in lists], TOKENS)])
        logprobs = pa.concat_arrays([self.logprobs, pa.array([lp for _, lp in lists], LOGPROBS)])
        assert len(ids) == n + len(lists)
        return ids.take(rows), logprobs.take(rows)


@dataclass
class ColumnarBatch:
    """``decode_batch_columnar``'s answer: per value an event (token fields not set) or None, and the tokens."""

    events: list[fast.FastEvent | None]
    tokens: TokenColumns


def decode_batch_columnar(values: Sequence[bytes | None], *, max_bytes: int = MAX_EVENT_BYTES) -> ColumnarBatch:
    """Decode raw wire events with their token arrays parsed into Arrow.

    None where this path refuses (send those to ``schemas.fast.decode_batch``,
    then ``decode_event``). An accepted LLM event's token fields hold raw JSON
    slices: read its tokens from ``tokens`` (row = its index in ``values``).
    """
    events: list[Any] = []
    ids, logprobs = _TokenSlices(_parse_ids, _ID_BYTES), _TokenSlices(_parse_numbers, _NUMBER_BYTES)
    for row, raw in enumerate(values):
        event = None
        if raw is not None and len(raw) <= max_bytes:
            try:
                event = fast._finish(_DECODER.decode(raw))
            except (msgspec.MsgspecError, ValueError, RecursionError):
                event = None
        if event is not None and type(event) in _TOKEN_FIELDS and not _take_tokens(event, row, ids, logprobs):
            event = None
        events.append(event)
    n = len(values)
    id_column, bad_ids = ids.column(n, TOKENS, lambda v: (v >= 0) & (v <= INT32_MAX))
    logprob_column, bad_logprobs = logprobs.column(n, LOGPROBS, np.isfinite)
    for row in bad_ids | bad_logprobs:
        events[row] = None
    return ColumnarBatch(events, TokenColumns(id_column, logprob_column))


def _take_tokens(event: Any, row: int, ids: _TokenSlices, logprobs: _TokenSlices) -> bool:
    """Queue an LLM event's token slices for parsing; False = refuse the event (not arrays, or a payload rule)."""
    id_field, logprob_field = _TOKEN_FIELDS[type(event)]
    payload = event.payload
    id_slice = _inner(getattr(payload, id_field))
    logprob_slice = _logprobs(getattr(payload, logprob_field)) if logprob_field else None
    if id_slice is False or logprob_slice is False:
        return False
    if logprob_field:
        n = len(logprob_slice) if isinstance(logprob_slice, np.ndarray) else _count(logprob_slice or b"")
        if logprob_slice is not None and id_slice is not None and n != _count(id_slice):
            return False  # one logprob per response token (a miscount from odd whitespace only refuses)
        if payload.token_source == "engine" and id_slice is None:
            return False
        if isinstance(logprob_slice, np.ndarray):
            logprobs.add_values(row, logprob_slice)
        elif logprob_slice is not None:
            logprobs.add(row, logprob_slice)
    if id_slice is not None:
        ids.add(row, id_slice)
    return True


def _inner(raw: msgspec.Raw | None) -> bytes | None | bool:
    """The text between a JSON array's brackets; None for null or absent; False when not an array."""
    if raw is None:
        return None
    text = bytes(raw)
    if text == _NULL:
        return None
    if text[:1] != b"[" or text[-1:] != b"]":
        return False
    return text[1:-1].strip(_WHITESPACE)


def _logprobs(raw: msgspec.Raw | None) -> bytes | np.ndarray | None | bool:
    """``_inner`` of a logprobs array; the values of the compact form (a base64 float32 string); False when neither
    (or a compact form that does not decode: the per-event path names the problem)."""
    if raw is None or bytes(raw)[:1] != b'"':
        return _inner(raw)
    try:
        return compact_logprobs.decode_array(msgspec.json.decode(raw, type=str))
    except (msgspec.MsgspecError, ValueError):
        return False


def _count(inner: bytes) -> int:
    return inner.count(b",") + 1 if inner else 0


Parsed = tuple[np.ndarray, np.ndarray]
"""(flat values, count per slice)"""


class _TokenSlices:
    """The array slices of one token field over a batch, parsed together into one Arrow list column.

    The whole batch is parsed at once; only if that fails are the slices
    checked one by one (bytes other than ``allowed`` and whitespace refuse a
    slice's event) and the rest parsed again.
    """

    def __init__(self, parse: Callable[[list[bytes]], Parsed | None], allowed: bytes) -> None:
        self.parse, self.allowed = parse, allowed
        self.rows: list[int] = []
        self.slices: list[bytes] = []
        self.values: dict[int, np.ndarray] = {}
        """Rows whose values came decoded (compact logprobs), not as text."""

    def add(self, row: int, inner: bytes) -> None:
        self.rows.append(row)
        self.slices.append(inner)

    def add_values(self, row: int, values: np.ndarray) -> None:
        self.values[row] = values

    def column(self, n: int, arrow_type: pa.ListType, valid: Callable[[np.ndarray], np.ndarray]) -> tuple[pa.Array, set[int]]:
        """(list column with ``n`` rows, rows refused: values ``valid`` refuses, or text that does not parse)."""
        rows, slices, bad = self.rows, self.slices, set()
        parsed = self.parse(slices)
        if parsed is None:
            rows, slices, bad = self._readable()
            parsed = self.parse(slices)
            if parsed is None:  # not expected after the check; refuse them all rather than guess
                return pa.nulls(n, arrow_type), set(self.rows)
        values, counts = parsed
        if self.values:  # merge the decoded rows in, in row order
            segments = dict(zip(rows, np.split(values, np.cumsum(counts)[:-1]) if len(rows) else []))
            segments.update(self.values)
            rows = sorted(segments)
            counts = np.array([len(segments[r]) for r in rows], np.int64)
            values = np.concatenate([segments[r] for r in rows])
        ok = valid(values)
        if not ok.all():
            starts = np.cumsum(counts) - counts
            filled = counts > 0
            refused = np.add.reduceat(~ok, starts[filled])
            bad |= {row for row, r in zip(np.asarray(rows)[filled].tolist(), refused) if r}
        lengths = np.zeros(n, np.int64)
        lengths[rows] = counts
        offsets = np.zeros(n + 1, np.int32)
        np.cumsum(lengths, out=offsets[1:])
        has = np.zeros(n, bool)
        has[rows] = True
        flat = pa.array(values.astype(arrow_type.value_type.to_pandas_dtype()), arrow_type.value_type)
        return pa.ListArray.from_arrays(pa.array(offsets), flat, type=arrow_type, mask=pa.array(~has)), bad

    def _readable(self) -> tuple[list[int], list[bytes], set[int]]:
        """(rows, slices) made only of ``allowed`` bytes once whitespace is removed, and the other rows."""
        rows, slices, bad = [], [], set()
        for row, text in zip(self.rows, self.slices):
            text = text.translate(None, _WHITESPACE)
            if text.translate(None, self.allowed):
                bad.add(row)
            else:
                rows.append(row)
                slices.append(text)
        return rows, slices, bad


def _parse_ids(slices: list[bytes]) -> Parsed | None:
    """Integers: one ``np.fromstring`` pass over the slices' items (None when their count is not the commas')."""
    counts = np.array([_count(s) for s in slices], np.int64)
    filled = [s for s in slices if s]
    values = _fromstring(b",".join(filled), np.int64) if filled else np.zeros(0, np.int64)
    return (values, counts) if values is not None and len(values) == counts.sum() else None


def _parse_numbers(slices: list[bytes]) -> Parsed | None:
    """Floats: Arrow's correctly rounded string-to-double cast over the slices' items."""
    counts = np.array([_count(s) for s in slices], np.int64)
    filled = [s for s in slices if s]
    if not filled:
        return np.zeros(0, np.float64), counts
    items = pc.split_pattern(pa.array([b",".join(filled)], pa.large_binary()), b",").values
    try:
        values = pc.cast(items, pa.float64()).to_numpy()
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    return (values, counts) if len(values) == counts.sum() else None


def _fromstring(text: bytes, dtype: type) -> np.ndarray | None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # numpy warns (and stops) at text it cannot read
        try:
            return np.fromstring(text, dtype=dtype, sep=",")
        except (ValueError, DeprecationWarning):
            return None
