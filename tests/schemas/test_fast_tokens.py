"""Guard: token arrays parsed straight into Arrow (schemas.fast_tokens) give the contract's rows and verdicts.

Valid events: byte-identical ``events`` rows (and typed rows) to the pydantic
contract's. Invalid token fields: refused by the columnar path, and the
ingester's batch decode then quarantines them with the contract's reasons,
also when they sit among valid events of the same batch.
"""

from __future__ import annotations

import json
import sys
from datetime import datetime, timezone

import pyarrow as pa
import pytest
from test_fast_decode import STAMP, batch_outcome, contract_outcome, coordinates, pydantic_rows
from test_wire_contract import event

from devkit.workload import WorkloadConfig, generate_events
from schemas import fast_tokens
from schemas.fast_tokens import _cut_arrays, decode_batch_columnar
from schemas.tables import EVENTS, LOGPROBS, TOKENS
from store.event_rows import events_table, typed_tables


@pytest.fixture(autouse=True, params=["arrays cut out", "small events whole"])
def cut_threshold(request, monkeypatch):
    """Every test runs with the token arrays of every event cut out before msgspec (``_cut_arrays``), and with
    the module's size threshold (the small test events then decoded whole)."""
    if request.param == "arrays cut out":
        monkeypatch.setattr(fast_tokens, "_CUT_MIN_BYTES", 0)


def columnar_rows(values: list[bytes]):
    batch = decode_batch_columnar(values)
    assert None not in batch.events
    return events_table(batch.events, coordinates(len(values)), ingested_at=STAMP,
                        tokens=batch.tokens.pick(list(range(len(values)))), ts=batch.timestamps(range(len(values))))


def request(ids, **payload) -> dict:
    raw = event("llm.request")
    raw["payload"].update(prompt_token_ids=ids, **payload)
    return raw


def extending(ids, call="c0", tokens=5) -> dict:
    """A request with a prefix reference (``call``/``tokens`` None: that half left out)."""
    return request(ids, **{k: v for k, v in (("extends_call_id", call), ("extends_tokens", tokens)) if v is not None})


def response(ids, logprobs, **payload) -> dict:
    raw = event("llm.response")
    raw["payload"].update(response_token_ids=ids, logprobs=logprobs, **payload)
    return raw


@pytest.mark.parametrize("separators", [(",", ":"), (", ", ": ")], ids=["compact", "spaced"])
def test_workload_events_give_byte_identical_rows(separators):
    events = list(generate_events(WorkloadConfig(tasks=6, rollouts_per_task=6, seed=3)))
    values = [json.dumps(e, separators=separators).encode() for e in events]
    ours, theirs = columnar_rows(values), pydantic_rows(values)
    assert ours.equals(theirs)
    for name, rows in typed_tables(ours).items():
        assert rows.equals(typed_tables(theirs)[name])


VALID = [
    request([]), request(None), request([0, 2**31 - 1]), request([7] * 3000),
    response([4, 5], [-1, 0]), response([4, 5, 6], [-0.0, 1e-300, 1.5e2]), response([], []),
    response([1, 2], None), response(None, None, token_source="none"), response([3], [-2.220446049250313e-16]),
    response([9], [-0.1234567890123456789]),
    extending([1, 2]), extending([]), extending([3], tokens=0),
]


@pytest.mark.parametrize("raw", VALID, ids=lambda r: json.dumps(r["payload"])[:60])
def test_valid_token_fields_read_the_same(raw):
    values = [json.dumps(raw).encode()]
    assert columnar_rows(values).equals(pydantic_rows(values))


def test_whitespace_inside_token_arrays_reads_the_same():
    text = json.dumps(response([1, 2, 3], [-0.5, -1.0, -2.0])).encode()
    for spaced in (b"[ 1 ,\n2,\t3 ]", b"[1 , 2 , 3]"):
        value = text.replace(b"[1, 2, 3]", spaced)
        assert spaced in value
        assert columnar_rows([value]).equals(pydantic_rows([value]))


NUMBER_SPELLINGS = [
    (b"[1, 2]", b"[-0, 2]"), (b"[-0.5, -0.25]", b"[-0, 1]"), (b"[-0.5, -0.25]", b"[1E2, 0e0]"),
    (b"[-0.5, -0.25]", b"[12345678901234567, -1e-320]"), (b"[-0.5, -0.25]", b"[-0.5,-2.5e-1]"),
    (b"[1, 2]", b"[1, 2.5]"), (b"[1, 2]", b"[1, 2e0]"), (b"[-0.5, -0.25]", b"[-0.5, 1e999]"),
    (b"[-0.5, -0.25]", b"[-0.5, 18446744073709551616]"), (b"[1, 2]", b"[1, 9223372036854775808]"),
    (b"[1, 2]", b"[[1], 2]"), (b"[1, 2]", b"[[], 2]"), (b"[-0.5, -0.25]", b"[[-0.5], []]"),
    (b"[1, 2]", b'["[1", 2]'),
]


@pytest.mark.parametrize("sent", [new for _, new in NUMBER_SPELLINGS])
def test_number_spellings_and_nesting_give_the_contracts_rows_and_reasons(sent):
    """Integer and float spellings simdjson reads, ints past 64 bits, and nested arrays (which simdjson's
    ``as_buffer`` would flatten): the same rows or quarantine reasons as the contract."""
    old = next(o for o, n in NUMBER_SPELLINGS if n == sent)
    value = json.dumps(response([1, 2], [-0.5, -0.25])).encode().replace(old, sent)
    assert sent in value
    assert batch_outcome([value]) == contract_outcome([value])


def _with(raw: dict, **payload) -> dict:
    raw["payload"].update(payload)
    return raw


KEYS_ELSEWHERE = [
    _with(request([1, 2]), messages=[{"role": "user", "content": "x", "prompt_token_ids": [9, 9]}]),
    _with(request(None), params={"prompt_token_ids": [1, 2]}),
    _with(request([1, 2]), params={"logprobs": [-1.0]}),
    _with(request([1, 2]), params={"logprobs": True, "top_logprobs": 2}),
    _with(response([1, 2], [-0.5, -0.25]), tool_calls=[{"id": "t", "logprobs": [-3.0]}]),
    _with(response([1, 2], None), tool_calls=[{"id": "t", "logprobs": [-3.0, -1.0]}]),
    _with(response(None, None), usage={"response_token_ids": [4]}),
    _with(response([1, 2], [-0.5, -0.25]), text="\u0000cut logprobs"),
    _with(response([1], "\u0000cut logprobs"), tool_calls=[{"id": "t", "logprobs": [-3.0]}]),  # a sentinel sent
    _with(response([1, 2], [-0.5, -0.25]), text='"logprobs":[1]'),
    _with(request([[1], [2]])),
    _with(request(["]", 1])),
]


@pytest.mark.parametrize("raw", KEYS_ELSEWHERE, ids=lambda r: json.dumps(r["payload"])[:70])
def test_token_keys_elsewhere_in_the_event_read_the_same(raw):
    """Token arrays are cut out of the bytes before msgspec reads the rest (``_cut_arrays``); a key that also
    appears elsewhere (messages, params, tool_calls, a string), or a cut that is not a flat array, must give
    the contract's rows and reasons all the same."""
    values = []
    for i, separators in enumerate([(",", ":"), (", ", ": ")]):
        raw["event_id"] = f"e-{i}"
        values.append(json.dumps(raw, separators=separators).encode())
    assert batch_outcome(values) == contract_outcome(values)


def test_workload_token_arrays_are_cut_out_before_msgspec():
    """The fast path this guards is the one taken: compact workload events have their token arrays cut."""
    events = list(generate_events(WorkloadConfig(tasks=1, rollouts_per_task=2, seed=3)))
    llm = [json.dumps(e, separators=(",", ":")).encode() for e in events if e["type"].startswith("llm.")]
    assert llm and all(_cut_arrays(v)[1] for v in llm)


INVALID = [
    request([-1]), request([2**31]), request([10**30]), request([1.0]), request([1e2]), request(["1"]),
    request([None]), request([[1]]), request({}), request("1,2"), request([True]), request([0, -5]),
    response([1], [1e400]), response([1], [-1e400]), response([1], ["x"]), response([1], [None]),
    response([1], [[]]), response([1, 2], [-0.1]), response([1], [-0.1, -0.2]),
    response(None, None, token_source="engine"), response([1], [True]),
    extending([1], tokens=None), extending([1], call=None), extending(None), extending([1], tokens=-1),
    extending([1], tokens=2**31), extending([1], tokens="5"), extending([1], call=""),
    request([1], call_id="c9", extends_call_id="c9", extends_tokens=1),
    response([1], [-1e39]), response([1], [-sys.float_info.max]),  # finite doubles that float32 makes -inf
]


@pytest.mark.parametrize("raw", INVALID, ids=lambda r: json.dumps(r["payload"])[:70])
def test_invalid_token_fields_leave_the_columnar_path(raw):
    value = json.dumps(raw).encode().replace(b"Infinity", b"1e400")  # a JSON number that overflows a double
    assert decode_batch_columnar([value]).events == [None]
    rows, reasons = batch_outcome([value])
    assert (rows, reasons) == contract_outcome([value])


def test_a_batch_mixing_valid_and_invalid_token_fields_gives_the_contracts_rows_and_reasons():
    values = []
    for i, raw in enumerate([*VALID, *INVALID, *VALID]):
        raw["event_id"] = f"e-{i}"
        values.append(json.dumps(raw).encode().replace(b"Infinity", b"1e400"))
    rows, reasons = batch_outcome(values)
    assert (rows, reasons) == contract_outcome(values)
    assert len(reasons) == len(INVALID) and len(rows) == 2 * len(VALID)


def test_pick_mixes_batch_rows_and_the_lists_of_events_decoded_one_by_one():
    """The batch's rows in any order, and events the contract decoded one by one (their own lists)."""
    values = [json.dumps(raw).encode() for raw in (response([1, 2], [-0.5, -0.25]), request([3]), request(None))]
    tokens = decode_batch_columnar(values).tokens
    ids, logprobs = tokens.pick([2, ([7, 8], [-1.0, -2.0]), 0, (None, None), 1, ([], None)])
    assert ids.to_pylist() == [None, [7, 8], [1, 2], None, [3], []]
    assert logprobs.to_pylist() == [None, [-1.0, -2.0], [-0.5, -0.25], None, None, None]
    assert (ids.type, logprobs.type) == (TOKENS, LOGPROBS)
    assert tokens.pick([]) == (pa.array([], TOKENS), pa.array([], LOGPROBS))


@pytest.mark.parametrize("rows", [[0, 1, 2, 4, 5, 9], [9, 8, 7], [3, 3, 4, 4], [0, 2, 4, 6, 8], list(range(10)), [5]],
                         ids=["runs with gaps", "reversed", "repeated", "no runs", "every row", "one row"])
def test_pick_copies_the_rows_asked_for_in_runs_or_not(rows):
    """``take`` copies one slice per run of consecutive rows: any choice of rows reads as the lists do."""
    raws = [response(list(range(i, 2 * i)), [-0.5] * i) if i % 3 else request([i] * i if i % 2 else None)
            for i in range(10)]
    tokens = decode_batch_columnar([json.dumps(raw).encode() for raw in raws]).tokens
    ids, logprobs = tokens.pick(rows)
    expected = [(r["payload"].get("response_token_ids", r["payload"].get("prompt_token_ids")),
                 r["payload"].get("logprobs")) for r in (raws[i] for i in rows)]
    assert ids.to_pylist() == [i for i, _ in expected] and logprobs.to_pylist() == [lp for _, lp in expected]
    assert (ids.type, logprobs.type) == (TOKENS, LOGPROBS)


TIMESTAMPS = [
    "2026-01-01T00:00:00Z", "2026-01-01T00:00:00.5Z", "2026-07-04T12:34:56.123456Z", "0001-01-01T00:00:00Z",
    "9999-12-31T23:59:59.999999Z", "2024-02-29T00:00:00Z", "1969-12-31T23:59:59.999999Z",
    "2026-01-01T00:00:00.1234567Z", "2026-01-01t00:00:00z", "2026-06-01 12:00:00+05:30", "2026-01-01T23:59:59-00:00",
    "2026-01-01T00:00:00+00:00", "2026-01-01T00:00:00+01:00", "9999-12-31T23:59:59+01:00",
]
"""Valid spellings of ``ts``, the usual one (read for the batch by Arrow) and others (read one by one)."""
BAD_TIMESTAMPS = [
    "0000-01-01T00:00:00Z", "2025-02-29T00:00:00Z", "2026-02-30T00:00:00Z", "2026-13-01T00:00:00Z",
    "2026-00-10T00:00:00Z", "2026-01-00T00:00:00Z", "2026-01-01T24:00:00Z", "2026-01-01T23:60:00Z",
    "2026-01-01T23:59:60Z", "2026-01-01T00:00:00", "2026-1-01T00:00:00Z", "2026-01-01T00:00:00ZZ", "",
    "2026-01-01T00:00:00.000000Z\n", " 2026-01-01T00:00:00Z", "２０２６-01-01T00:00:00Z", "2026-01-01T00:00:00.Z",
    "0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-01:00",
]
"""Spellings the contract refuses, some of them the usual shape (Arrow's cast must not read them either)."""


@pytest.mark.parametrize("ts", TIMESTAMPS + BAD_TIMESTAMPS)
def test_each_ts_spelling_gives_the_contracts_row_or_reason(ts):
    values = [json.dumps(event("reward", ts=ts, event_id="e-1")).encode(),
              json.dumps({**request([1, 2]), "ts": ts, "event_id": "e-2"}).encode()]
    assert batch_outcome(values) == contract_outcome(values)


def test_a_batch_of_ts_spellings_gives_the_contracts_rows_and_reasons():
    """Usual spellings the cast reads among ones read one by one and ones refused, in one batch (a refused
    date of the usual shape makes the whole batch read one by one)."""
    for spellings in (TIMESTAMPS, TIMESTAMPS + BAD_TIMESTAMPS):
        values = [json.dumps(event("reward", ts=ts, event_id=f"e-{i}")).encode() for i, ts in enumerate(spellings)]
        rows, reasons = batch_outcome(values)
        assert (rows, reasons) == contract_outcome(values)
        assert len(rows) == len(TIMESTAMPS)


def test_timestamps_mix_batch_rows_and_the_ts_of_events_decoded_one_by_one():
    values = [json.dumps(event("reward", ts=ts)).encode() for ts in ("2026-01-01T00:00:01Z", "2026-01-01T00:00:02Z")]
    batch = decode_batch_columnar(values)
    own = datetime(2020, 5, 6, 7, 8, 9, 10, tzinfo=timezone.utc)
    assert batch.timestamps([1, own, 0]).to_pylist() == [
        datetime(2026, 1, 1, 0, 0, 2, tzinfo=timezone.utc), own, datetime(2026, 1, 1, 0, 0, 1, tzinfo=timezone.utc)]
    assert batch.timestamps([1]).type == batch.timestamps([own]).type == EVENTS.field("ts").type


@pytest.mark.parametrize("logprob", [-1e39, -sys.float_info.max, 3.5e38])
def test_a_logprob_past_float32s_range_is_quarantined_not_stored_as_infinity(logprob):
    value = json.dumps(response([1], [logprob])).encode()
    rows, reasons = batch_outcome([value])
    assert rows == [] and [field for field, _ in reasons] == ["payload.logprobs.0"]


def test_the_largest_logprob_float32_holds_is_stored_as_sent():
    value = json.dumps(response([1], [-3.4e38])).encode()
    rows, reasons = batch_outcome([value])
    assert reasons == [] and rows[0]["logprobs"] == pytest.approx([-3.4e38], rel=1e-7)
