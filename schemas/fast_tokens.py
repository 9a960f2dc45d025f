"""Token arrays of a batch decoded straight into flat columns, without a Python object per token id.

``schemas.fast`` decodes a 4 KB workload event in ~19 us, but its ~490 token
ids become Python ints (~12 us) that ``events_table`` then converts to Arrow
lists (~13-25 us): the largest cost per event left. Here the LLM payloads'
token fields are read as ``msgspec.Raw`` (msgspec still checks that they are
well-formed JSON, no Python objects made); simdjson parses each slice into a
C array, and the batch's arrays become one flat NumPy column per field with
a length per row (events of 8 KB or more have their arrays cut out of the
bytes first, so that msgspec does not scan them: ``_cut_arrays``).
``ts`` is read for the whole batch too (``_timestamps``: one Arrow cast for the
usual spelling). ``TokenColumns.pick`` turns the rows a batch keeps into
Arrow ``list<int32>`` / ``list<float32>`` columns with one gather (none when
every row is kept).

What the contract says about those fields is checked on the slices and the
parsed arrays: a flat array (or null); token ids JSON integers in [0,
INT32_MAX]; logprobs JSON numbers, finite and within float32's range; one logprob per response token;
``token_source="engine"`` has ids. Logprobs in the compact form (a base64
float32 string, ``schemas.compact_logprobs``) are decoded straight into the
column. An event whose token fields fail any of these checks is refused here (None) and takes the per-event path
(``schemas.fast.decode_batch``, then the pydantic contract), which accepts it
or names the problem. ``tests/schemas/test_fast_tokens.py`` holds this path
to the contract's rows and verdicts.

Measured (``Batch.decode``, this path against the one before it in one process, CPU min / median of 7
alternating runs, load ~15 on 2 cores): 6.6k workload events 75 / 88 -> 66 / 72 us/event; 774 ``large``
events (~3,000 ids each) 230 / 264 -> 175 / 209. Parsing ids: ``np.fromstring`` over the batch's joined
slices ~35 ns/id, simdjson per event ~16-20 (logprobs: Arrow's string-to-double cast ~58, simdjson ~29).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, ClassVar

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import simdjson

from schemas import compact_logprobs, fast
from schemas.events import FLOAT32_LIMIT, INT32_MAX, reference_problem
from schemas.tables import EVENTS, LOGPROBS, TOKENS
from schemas.versions import MAX_EVENT_BYTES

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
        """The length and ``engine`` rules are checked on the parsed arrays (``_take_tokens``)."""


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
class FlatLists:
    """One token field over a batch: every row's values back to back, a length per row, and which rows have it."""

    values: np.ndarray
    """All rows' values, in order, checked against the contract; in any dtype that holds them (the parser's
    int64 / float64), cast to the Arrow value type's when taken."""
    lengths: np.ndarray
    """int64 per row (0 where the row has no array)."""
    present: np.ndarray
    """bool per row: False where the field is null or absent (the row's list is null, not empty)."""
    arrow_type: pa.ListType

    @classmethod
    def from_lists(cls, lists: Sequence[Sequence[float] | None], arrow_type: pa.ListType) -> FlatLists:
        """From Python lists (events decoded one by one), converted by ``pa.array`` as ``events_table`` does."""
        column = pa.array(lists, arrow_type)
        offsets = column.offsets.to_numpy()
        values = column.values.slice(offsets[0], offsets[-1] - offsets[0])
        return cls(values.to_numpy(zero_copy_only=False), np.diff(offsets).astype(np.int64),
                   column.is_valid().to_numpy(zero_copy_only=False), arrow_type)

    def concat(self, other: FlatLists) -> FlatLists:
        return FlatLists(np.concatenate([self.values, other.values]), np.concatenate([self.lengths, other.lengths]),
                         np.concatenate([self.present, other.present]), self.arrow_type)

    def take(self, rows: np.ndarray) -> pa.Array:
        """The Arrow list column of ``rows`` (int64 indices, any order).

        The values are copied once, cast on the way, as one slice per run of consecutive rows (a batch keeps its
        rows in order, less a few duplicates): a gather by value index built three index arrays of 8 bytes per
        value, and each fresh page of those cost the loop a page fault (~3.5 per 4 KB workload event).
        """
        starts = np.zeros(len(self.lengths) + 1, np.int64)
        np.cumsum(self.lengths, out=starts[1:])
        lengths = self.lengths[rows]
        offsets = np.zeros(len(rows) + 1, np.int64)
        np.cumsum(lengths, out=offsets[1:])
        dtype = self.arrow_type.value_type.to_pandas_dtype()
        if not len(rows):
            values = np.zeros(0, dtype)
        else:
            breaks = np.flatnonzero(np.diff(rows) != 1) + 1
            firsts, lasts = rows[np.r_[0, breaks]], rows[np.r_[breaks - 1, len(rows) - 1]]
            pieces = [self.values[a:b] for a, b in zip(starts[firsts].tolist(), starts[lasts + 1].tolist())]
            values = np.concatenate(pieces, dtype=dtype, casting="unsafe")  # checked before: no wrap-around
        return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), pa.array(values, self.arrow_type.value_type),
                                        type=self.arrow_type, mask=pa.array(~self.present[rows]))


@dataclass(frozen=True)
class TokenColumns:
    """The batch's token fields, one row per decoded value (no array where it has none or was refused)."""

    ids: FlatLists
    """int32 values, for list<int32>"""
    logprobs: FlatLists
    """float32 values, for list<float32>"""

    def pick(self, sources: Sequence[int | tuple[list[int] | None, list[float] | None]]) -> tuple[pa.Array, pa.Array]:
        """(token_ids, logprobs) columns for rows in order: a row of this batch, or (ids, logprobs) lists of an
        event decoded one by one."""
        lists = [s for s in sources if not isinstance(s, int)]
        ids, logprobs = self.ids, self.logprobs
        if lists:  # appended as extra rows after the batch's own
            ids = ids.concat(FlatLists.from_lists([i for i, _ in lists], TOKENS))
            logprobs = logprobs.concat(FlatLists.from_lists([lp for _, lp in lists], LOGPROBS))
            extra = iter(range(len(self.ids.lengths), len(ids.lengths)))
            sources = [s if isinstance(s, int) else next(extra) for s in sources]
        rows = np.fromiter(sources, np.int64, len(sources))
        return ids.take(rows), logprobs.take(rows)


@dataclass
class ColumnarBatch:
    """``decode_batch_columnar``'s answer: per value an event (token fields and ``ts`` not set) or None, the
    tokens, and ``ts`` per value."""

    events: list[fast.FastEvent | None]
    tokens: TokenColumns
    ts: np.ndarray
    """int64 per value: ``ts`` in microseconds since the epoch, UTC (0 where the value was refused)."""

    def timestamps(self, sources: Sequence[int | datetime]) -> pa.Array:
        """The ``ts`` column for rows in order: a row of this batch, or the UTC ``ts`` of an event decoded one by
        one."""
        if all(isinstance(s, int) for s in sources):
            micros = self.ts[np.fromiter(sources, np.int64, len(sources))]
        else:
            micros = np.fromiter((self.ts[s] if isinstance(s, int) else _micros(s) for s in sources), np.int64,
                                 len(sources))
        return pa.array(micros, TIMESTAMP)


def decode_batch_columnar(values: Sequence[bytes | None], *, max_bytes: int = MAX_EVENT_BYTES) -> ColumnarBatch:
    """Decode raw wire events with their token arrays parsed into flat columns.

    None where this path refuses (send those to ``schemas.fast.decode_batch``,
    then ``decode_event``). An accepted LLM event's token fields hold raw JSON
    slices: read its tokens from ``tokens`` (row = its index in ``values``).
    """
    events: list[Any] = []
    ids = _TokenColumn("i", TOKENS, lambda v: (v >= 0) & (v <= INT32_MAX))
    logprobs = _TokenColumn("d", LOGPROBS, lambda v: np.abs(v) < FLOAT32_LIMIT, compact=True)  # NaN: False
    for row, raw in enumerate(values):
        event, cuts = None, {}
        if raw is not None and len(raw) <= max_bytes and fast.is_utf8(raw):
            doc, cuts = _cut_arrays(raw) if len(raw) >= _CUT_MIN_BYTES else (raw, {})
            event = _decode(doc)
            if cuts and not _cuts_in_place(event, cuts):
                event, cuts = _decode(raw), {}
        if event is not None and type(event) in _TOKEN_FIELDS and not _take_tokens(event, row, ids, logprobs, cuts):
            event = None
        events.append(event)
    n = len(values)
    id_column, bad_ids = ids.column(n)
    logprob_column, bad_logprobs = logprobs.column(n)
    ts, bad_ts = _timestamps(events)
    for row in bad_ids | bad_logprobs | bad_ts:
        events[row] = None
    return ColumnarBatch(events, TokenColumns(id_column, logprob_column), ts)


def _decode(raw: bytes) -> Any:
    """The event at the current version, ``ts`` still text (``_timestamps`` reads the batch's); None if refused."""
    try:
        event = _DECODER.decode(raw)
    except (msgspec.MsgspecError, ValueError, RecursionError):
        return None
    return event if fast.is_current(event) else None


TIMESTAMP = EVENTS.field("ts").type
_UTC_TS = r"^(?:000[1-9]|00[1-9]\d|0[1-9]\d\d|[1-9]\d{3})-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{1,6})?Z$"
"""The usual spelling of ``ts`` (UTC, ``Z``, at most microseconds, year 1 or later), read by Arrow's cast for the
whole batch; every other spelling the contract allows is read one by one as the contract reads it."""
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_MICROSECOND = timedelta(microseconds=1)


def _timestamps(events: list[Any]) -> tuple[np.ndarray, set[int]]:
    """(``ts`` in microseconds per row, rows whose ``ts`` the contract refuses), for the batch's decoded events.

    One regex match and one cast over the batch instead of a regex, ``fromisoformat`` and a ``datetime`` per event
    (~2.5 us of a 4 KB workload event's decode). Strings of the usual spelling where Arrow's cast fails (a date
    that does not exist, hour 24, second 60) make the whole batch read one by one: ``fast.parse_ts`` decides.
    """
    texts = pa.array([e.ts if e is not None else None for e in events], pa.string())
    usual = pc.fill_null(pc.match_substring_regex(texts, _UTC_TS), False)
    micros = np.zeros(len(events), np.int64)
    in_bulk = usual.to_numpy(zero_copy_only=False)
    try:
        micros[in_bulk] = texts.filter(usual).cast(TIMESTAMP).cast(pa.int64()).to_numpy()
    except pa.ArrowInvalid:
        in_bulk[:] = False
    refused: set[int] = set()
    for row in np.flatnonzero(~in_bulk).tolist():
        if events[row] is not None:
            parsed = fast.parse_ts(events[row].ts)
            if parsed is None:
                refused.add(row)
            else:
                micros[row] = _micros(parsed)
    return micros, refused


def _micros(ts: datetime) -> int:
    return (ts - _EPOCH) // _MICROSECOND


_CUT_MIN_BYTES = 8 * 1024
"""Smaller events are decoded whole: there the cut's few Python steps cost what msgspec's scan of the arrays does
(workload events, 0.5-24 KB: the same decode CPU within noise cutting all, none, or those >= 8 KB); 17 KB
``large`` events: columnar decode 149 -> 125 us/event (CPU min of 9, load ~18)."""
_CUT_KEYS = {name: b'"%s":[' % name.encode() for name in ("prompt_token_ids", "response_token_ids", "logprobs")}
_CUTS_BY_TYPE = {b'request"': ("prompt_token_ids",), b'response"': ("response_token_ids", "logprobs")}
_LLM_TYPE = b'"type":"llm.'
_SENTINEL_MARK = b"\\u0000cut "
_SENTINELS = {name: msgspec.Raw(b'"%s%s"' % (_SENTINEL_MARK, name.encode())) for name in _CUT_KEYS}
"""JSON strings put where a token array was cut out; a value that already holds the mark is never cut."""


def _cut_arrays(raw: bytes) -> tuple[bytes, dict[str, bytes]]:
    """``raw`` with its token arrays cut out, so that msgspec does not scan their numbers (~3 ns/byte: 42 of
    59 us for a 17 KB ``large`` event), and the arrays' text by field name.

    A guess made on bytes, in a few ``find`` calls that skip the arrays' own bytes: for the first ``"type":"llm.``
    found, each token field whose key occurs once, written compactly (``"logprobs":[``), is cut up to the first
    ``]`` and its field's sentinel string takes its place. The guess counts only if the rest of ``raw`` holds no
    sentinel mark and every sentinel then decodes as its own payload field (``_cuts_in_place``): the document
    read is then the original's, byte for byte, with the arrays, which simdjson checks are flat arrays of numbers.
    """
    at = raw.find(_LLM_TYPE)
    if at == -1:
        return raw, {}
    names = _CUTS_BY_TYPE.get(raw[at + len(_LLM_TYPE):at + len(_LLM_TYPE) + 9].partition(b'"')[0] + b'"', ())
    found = []
    for name in names:
        key = _CUT_KEYS[name]
        at = raw.find(key)
        if at != -1:
            start = at + len(key) - 1
            end = raw.find(b"]", start) + 1
            if end and raw.find(key, end) == -1:
                found.append((start, end, name))
    found.sort()
    pieces, cuts, pos = [], {}, 0
    for start, end, name in found:
        if start < pos or raw.find(_SENTINEL_MARK, pos, start) != -1:  # overlapping guesses, or a mark sent
            return raw, {}
        pieces += [raw[pos:start], bytes(_SENTINELS[name])]
        cuts[name] = raw[start:end]
        pos = end
    if not cuts or raw.find(_SENTINEL_MARK, pos) != -1:
        return raw, {}
    pieces.append(raw[pos:])
    return b"".join(pieces), cuts


def _cuts_in_place(event: Any, cuts: dict[str, bytes]) -> bool:
    """Whether every cut array was a token field of the event's own payload (its sentinel decoded there)."""
    fields = _TOKEN_FIELDS.get(type(event), ())
    return all(name in fields and getattr(event.payload, name) == _SENTINELS[name] for name in cuts)


def _take_tokens(event: Any, row: int, ids: _TokenColumn, logprobs: _TokenColumn, cuts: dict[str, bytes]) -> bool:
    """Parse an LLM event's token arrays (``cuts``, else its raw fields) into the columns; False = refuse the
    event (not flat arrays of numbers of the type, or a payload rule)."""
    id_field, logprob_field = _TOKEN_FIELDS[type(event)]
    payload = event.payload
    id_values = ids.parse(cuts.get(id_field) or getattr(payload, id_field))
    logprob_values = logprobs.parse(cuts.get(logprob_field) or getattr(payload, logprob_field)) if logprob_field \
        else None
    if id_values is _REFUSED or logprob_values is _REFUSED:
        return False
    if logprob_field:
        if logprob_values is not None and id_values is not None and len(logprob_values) != len(id_values):
            return False  # one logprob per response token
        if payload.token_source == "engine" and id_values is None:
            return False
        if logprob_values is not None:
            logprobs.add(row, logprob_values)
    if id_values is not None:
        ids.add(row, id_values)
    return True


_REFUSED = np.zeros(0)
"""``_TokenColumn.parse``'s answer for a value that is not a flat array of numbers of the column's type."""


def _compact_values(text: bytes) -> np.ndarray:
    """The values of compact logprobs (a JSON string); ``_REFUSED`` when they do not decode (the per-event path
    names the problem)."""
    try:
        return compact_logprobs.decode_array(msgspec.json.decode(text, type=str))
    except (msgspec.MsgspecError, ValueError):
        return _REFUSED


class _TokenColumn:
    """One token field over a batch: each event's array parsed by simdjson, values kept per row.

    simdjson's ``as_buffer`` writes a JSON array's numbers straight into a C
    array (ids as int64, logprobs as double; its number parsing is exact, as
    every JSON decoder's is): ~2x faster than ``np.fromstring`` over the
    batch's ids, and no Python object per number. The values are checked
    against the contract (``valid``, an interval: every value passes when the
    least and the greatest do) over the whole batch at once, by its bounds.
    """

    def __init__(self, of_type: str, arrow_type: pa.ListType, valid: Callable[[np.ndarray], np.ndarray], *,
                 compact: bool = False) -> None:
        self.of_type, self.arrow_type, self.valid, self.compact = of_type, arrow_type, valid, compact
        self.dtype = {"i": np.int64, "d": np.float64}[of_type]
        self.parser = simdjson.Parser()
        self.rows: list[int] = []
        self.arrays: list[np.ndarray] = []

    def parse(self, raw: msgspec.Raw | bytes | None) -> np.ndarray | None:
        """The array's numbers (or compact logprobs' values); None for null or absent; ``_REFUSED`` when not a flat
        array of such numbers."""
        if raw is None:
            return None
        text = bytes(raw)
        if text[:1] == b'"' and self.compact:
            return _compact_values(text)
        if text[:1] != b"[":
            return None if text == _NULL else _REFUSED
        if text.find(b"[", 1) != -1:  # nested arrays: as_buffer would flatten them
            return _REFUSED
        try:
            return np.frombuffer(self.parser.parse(text).as_buffer(of_type=self.of_type), self.dtype)
        except (ValueError, TypeError, RuntimeError):  # TypeError: another JSON type; RuntimeError: past 64 bits
            return _REFUSED

    def add(self, row: int, values: np.ndarray) -> None:
        self.rows.append(row)
        self.arrays.append(values)

    def column(self, n: int) -> tuple[FlatLists, set[int]]:
        """(the field over ``n`` rows, rows whose values ``valid`` refuses)."""
        lengths = np.zeros(n, np.int64)
        lengths[self.rows] = np.fromiter(map(len, self.arrays), np.int64, len(self.arrays))
        present = np.zeros(n, bool)
        present[self.rows] = True
        values = np.concatenate(self.arrays) if self.arrays else np.zeros(0, self.dtype)
        bad: set[int] = set()
        if values.size and not self.valid(np.array([values.min(), values.max()])).all():
            # the bounds (NaN propagates through min and max) are out: find the rows, value by value
            ok = self.valid(values)
            filled = lengths > 0
            refused = np.add.reduceat(~ok, (np.cumsum(lengths) - lengths)[filled])
            bad = {row for row, r in zip(np.flatnonzero(filled).tolist(), refused) if r}
        return FlatLists(values, lengths, present, self.arrow_type), bad
