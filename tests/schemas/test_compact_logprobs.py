"""Logprobs in the compact form (base64 float32) decode to exactly the numbers they stand for, on every path.

The pydantic contract, the ingester's columnar path and its batch decode give
the same ``events`` rows for the compact form as for the same values as JSON
numbers; a compact form that is not base64, not whole float32 values, not
finite or of the wrong length is refused with the contract's reason.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from test_fast_decode import batch_outcome, contract_outcome, pydantic_rows
from test_fast_tokens import columnar_rows, response

from schemas import compact_logprobs
from schemas.events import COMPACT_LOGPROBS, EVENT_ADAPTER

FLOAT32 = np.array([-0.5, -1.2345678e-4, -7.25, 0.0, -3.4e38, -1e-45], dtype=np.float32).astype(np.float64).tolist()


def test_the_compact_form_is_exact_and_only_used_where_it_is():
    text = compact_logprobs.encode(FLOAT32)
    assert len(text) == 4 * len(FLOAT32) * 4 // 3 and compact_logprobs.decode(text) == FLOAT32
    assert compact_logprobs.encode([-0.1]) is None  # not a float32 value
    assert compact_logprobs.encode([float("nan")]) is None and compact_logprobs.encode([]) == ""


def test_a_response_written_compact_reads_back_the_same_numbers():
    raw = response(list(range(len(FLOAT32))), FLOAT32, token_source="engine")
    event = EVENT_ADAPTER.validate_json(json.dumps(raw))
    compact = json.loads(event.model_dump_json(context={COMPACT_LOGPROBS: True}))
    assert compact["payload"]["logprobs"] == compact_logprobs.encode(FLOAT32)
    assert EVENT_ADAPTER.validate_python(compact) == event
    inexact = response([1], [-0.1])  # written as numbers, exactly as given
    assert json.loads(EVENT_ADAPTER.validate_python(inexact).model_dump_json(
        context={COMPACT_LOGPROBS: True}))["payload"]["logprobs"] == [-0.1]


@pytest.mark.parametrize("values", [FLOAT32, [], [-0.5] * 3000], ids=["float32", "empty", "long"])
def test_every_path_gives_the_rows_of_the_same_values_as_numbers(values):
    ids = list(range(len(values)))

    def value(logprobs, event_id: str = "e-1") -> bytes:
        return json.dumps({**response(ids, logprobs), "event_id": event_id}).encode()

    as_numbers, compact = value(values), value(compact_logprobs.encode(values))
    theirs = pydantic_rows([as_numbers])
    assert pydantic_rows([compact]).equals(theirs) and columnar_rows([compact]).equals(theirs)
    mixed = [value(values, "e-1"), value(compact_logprobs.encode(values), "e-2"), value([-0.1] * len(ids), "e-3"),
             value(compact_logprobs.encode(values), "e-4")]
    rows, reasons = batch_outcome(mixed)
    assert (rows, reasons) == contract_outcome(mixed) and len(rows) == 4
    assert rows[0]["logprobs"] == rows[1]["logprobs"] == rows[3]["logprobs"]


@pytest.mark.parametrize("logprobs, problem", [
    ("AAAAvwAAgL", "must be base64"), ("!!!!", "must be base64"), ("AAAAvw", "must be base64"),
    ("AAAAAA==", "send one logprob per response token"), ("AADAfw==", "must be finite"),
    (compact_logprobs.encode([-0.5, -0.5, -0.5])[:-1] + "=", "must hold whole float32 values"),
])
def test_a_compact_form_that_is_wrong_is_refused_with_the_contracts_reason(logprobs, problem):
    value = json.dumps(response([1, 2], logprobs)).encode()
    rows, reasons = batch_outcome([value])
    assert (rows, reasons) == contract_outcome([value]) and rows == []
    assert len(reasons) == 1 and problem in reasons[0][1] and reasons[0][0].startswith("payload")
