"""Logprobs as base64 float32: the compact form ``llm.response.logprobs`` may take on the wire.

An engine computes logprobs in float32 and writes each as the shortest text of
that value as a double (``-0.00012302082125097513``: ~20 bytes a token); the
lake keeps them as float32 (``list<float32>``). The same values as the
base64 of their little-endian float32 bytes take 5.33 bytes a token, and
exactly the same numbers come back. Measured on bench/sessions with real
engine logprobs (``serve-model``), each call's events one zstd batch: 50.4
KB stored per 30-turn rollout as JSON numbers, 41.3 KB compact (1.22x);
before compression 37.9 vs 10.8 KB of logprobs.

>>> encode([-0.5, -0.25])
'AAAAvwAAgL4='
>>> decode('AAAAvwAAgL4=')
[-0.5, -0.25]
>>> encode([-0.1]) is None  # not a float32 value: sent as a JSON number, exactly as given
True
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence

import numpy as np


def encode(values: Sequence[float]) -> str | None:
    """The compact form of ``values``; None unless every value is a finite float32 (the form would not be exact)."""
    doubles = np.asarray(values, dtype=np.float64)
    floats = doubles.astype("<f4")
    if not (np.isfinite(doubles).all() and np.array_equal(floats, doubles)):
        return None
    return base64.b64encode(floats.tobytes()).decode("ascii")


def decode_array(text: str | bytes) -> np.ndarray:
    """The float32 values of a compact form (as float64). Raises ``ValueError`` naming what is wrong."""
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("logprobs as a string must be base64 (RFC 4648, with padding) of little-endian float32 "
                         "values") from None
    if len(raw) % 4:
        raise ValueError(f"logprobs as a string must hold whole float32 values: {len(raw)} bytes is not a multiple "
                         "of 4")
    values = np.frombuffer(raw, dtype="<f4").astype(np.float64)
    if not np.isfinite(values).all():
        raise ValueError("logprobs must be finite numbers: the base64 float32 values hold NaN or Infinity")
    return values


def decode(text: str | bytes) -> list[float]:
    """The values of a compact form, as Python floats (``decode_array``)."""
    return decode_array(text).tolist()
