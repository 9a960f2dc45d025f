"""CPU seconds of a build by stage, measured by wrapping the pipeline's stage functions (bench only).

- ``plan``: selection, advantages, call index (DuckDB on scalars): process CPU, nothing else runs then.
- ``read``: decoding the token files of each batch (``read_batch``, on the read-ahead thread): that thread's CPU.
- ``group``: matching calls to their token rows (``calls_by_rollout``), ``merge``: ``merge_calls``,
  ``rows``: Arrow record batches (``_record_batch``), ``write``: Parquet encoding and the Delta commit,
  ``hash``: the content hash (on a helper thread, beside the encoding): CPU of the thread that runs them.
- ``finish``: lineage rows, manifest, registry append: process CPU.
- ``other``: the rest of the process CPU (Arrow/DuckDB worker threads, the interpreter's own work).
"""

from __future__ import annotations

import resource
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from pipelines.datasets import build, calls, content_hash, sample_files, samples


def process_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


@contextmanager
def cpu_by_stage() -> Iterator[dict[str, float]]:
    """Yields a dict filled with CPU seconds per stage while the block runs a build (one at a time)."""
    spent: dict[str, float] = defaultdict(float)
    patches = [
        (build, "_plan", _timed(spent, "plan", process_cpu)),
        (calls, "read_batch", _timed(spent, "read", time.thread_time)),
        (samples, "calls_by_rollout", _timed_generator(spent, "group")),
        (samples, "merge_calls", _timed(spent, "merge", time.thread_time)),
        (samples.SampleStream, "_record_batch", _timed(spent, "rows", time.thread_time)),
        (sample_files._File, "write", _timed(spent, "write", time.thread_time)),
        (sample_files._File, "close", _timed(spent, "write", time.thread_time)),
        (sample_files, "_commit", _timed(spent, "write", time.thread_time)),
        (content_hash.ContentHash, "update", _timed(spent, "hash", time.thread_time)),
        (build, "_lineage", _timed(spent, "finish", process_cpu)),
        (build, "record_version", _timed(spent, "finish", process_cpu)),
    ]
    originals = [(owner, name, getattr(owner, name)) for owner, name, _ in patches]
    for owner, name, wrap in patches:
        setattr(owner, name, wrap(getattr(owner, name)))
    started = process_cpu()
    try:
        yield spent
    finally:
        for owner, name, original in originals:
            setattr(owner, name, original)
        spent["other"] = max(0.0, process_cpu() - started - sum(spent.values()))
        for stage in spent:
            spent[stage] = round(spent[stage], 3)


def _timed(spent: dict[str, float], stage: str, clock: Callable[[], float]) -> Callable[[Callable], Callable]:
    def wrap(function: Callable) -> Callable:
        def timed(*args: Any, **kwargs: Any) -> Any:
            started = clock()
            try:
                return function(*args, **kwargs)
            finally:
                spent[stage] += clock() - started

        return timed

    return wrap


def _timed_generator(spent: dict[str, float], stage: str) -> Callable[[Callable], Callable]:
    def wrap(function: Callable) -> Callable:
        def timed(*args: Any, **kwargs: Any) -> Iterator:
            items = function(*args, **kwargs)
            while True:
                started = time.thread_time()
                try:
                    item = next(items)
                except StopIteration:
                    return
                finally:
                    spent[stage] += time.thread_time() - started
                yield item

        return timed

    return wrap
