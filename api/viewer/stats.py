"""Success rate by harness version over time, with Wilson score intervals (the chart page).

A rollout counts once it has ended (any status but ``running``); it
succeeded when its status is ``succeeded``. Buckets are hours when the
rollouts span at most ``HOURLY_SPAN`` and days otherwise. The Wilson
interval is used instead of the normal one because buckets are small and
rates sit near 0 or 1, where the normal interval leaves [0, 1] or collapses
to a point.
"""

from __future__ import annotations

import math
from datetime import timedelta
from statistics import NormalDist
from typing import Literal

from api.services import QueryService
from api.viewer.models import SuccessChart, SuccessPoint, SuccessSeries
from schemas.tables import ROLLOUTS_VIEW

HOURLY_SPAN = timedelta(days=2)
"""Rollouts spanning at most this long are bucketed by hour, longer spans by day."""

Bucket = Literal["auto", "hour", "day"]

_AT = "coalesce(started_at, first_event_at)"
_ENDED = (f"FROM {ROLLOUTS_VIEW} WHERE status <> 'running' AND harness_name IS NOT NULL "
          "AND (? IS NULL OR harness_name = ?)")
_SPAN = f"SELECT min({_AT}) AS first, max({_AT}) AS last {_ENDED}"
_COUNTS = f"""SELECT harness_name || '@' || coalesce(harness_version, '?') AS harness,
    date_trunc(?, {_AT}) AS bucket,
    count(*) AS n, count(*) FILTER (WHERE status = 'succeeded') AS succeeded
    {_ENDED} GROUP BY ALL ORDER BY harness, bucket"""


def wilson_interval(successes: int, n: int, *, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion.

    >>> [round(x, 3) for x in wilson_interval(9, 10)]
    [0.596, 0.982]
    """
    if n <= 0:
        raise ValueError("n must be positive")
    if not 0 <= successes <= n:
        raise ValueError(f"successes ({successes}) must be between 0 and n ({n})")
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    p = successes / n
    denominator = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
    return max(0.0, centre - half), min(1.0, centre + half)


def success_chart(service: QueryService, tenant: str, *, harness: str | None = None, bucket: Bucket = "auto",
                  confidence: float = 0.95) -> SuccessChart:
    """Per harness version (``harness`` limits it to one harness name), one point per bucket."""
    with service.sandbox(tenant) as box:
        if bucket == "auto":
            span = box.execute(_SPAN, [harness, harness]).to_pylist()[0]
            wide = span["first"] is not None and span["last"] - span["first"] > HOURLY_SPAN
            bucket = "day" if wide else "hour"
        rows = box.execute(_COUNTS, [bucket, harness, harness]).to_pylist()
    series: dict[str, list[SuccessPoint]] = {}
    for row in rows:
        low, high = wilson_interval(row["succeeded"], row["n"], confidence=confidence)
        series.setdefault(row["harness"], []).append(SuccessPoint(
            bucket=row["bucket"], n=row["n"], succeeded=row["succeeded"], rate=row["succeeded"] / row["n"],
            low=low, high=high))
    return SuccessChart(bucket=bucket, confidence=confidence,
                        series=[SuccessSeries(harness=h, points=p) for h, p in series.items()])
