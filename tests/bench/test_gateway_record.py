"""bench/gateway's results.json summary names the 200 req/s overhead the run measured."""

from __future__ import annotations

import importlib.util
from pathlib import Path

RUN = Path(__file__).resolve().parents[2] / "bench" / "gateway" / "run.py"


class Captured:
    def write(self, **fields: object) -> None:
        self.fields = fields


def test_summary_has_the_200_req_s_overhead_of_a_run():
    spec = importlib.util.spec_from_file_location("bench_gateway_run", RUN)
    run = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(run)
    side = {"p50_ms": 1.0, "p99_ms": 2.0, "req_s": 100.0, "n": 10, "errors": 0}
    results = {"rates": {200: {"direct": side, "gateway": side, "overhead_p50_ms": 2.5, "overhead_p99_ms": 9.25}},
               "max_direct": {"req_s": 2000.0}, "max_gateway": {"req_s": 400.0}, "max_ratio": 0.2,
               "cpu_ms_per_request": {"gateway_process": 1.6}}
    recorder = Captured()
    run.record(recorder, results)
    assert recorder.fields["summary"].startswith("200 req/s: p50 +2.50 ms, p99 +9.25 ms")
