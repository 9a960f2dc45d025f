"""The durable spool: order, persistence across reopen, torn tails, bounds, segment cleanup."""

from __future__ import annotations

import pytest

from ingest.spool import Spool, SpoolFull, SpoolLocked


def records(n: int, start: int = 0) -> list[tuple[bytes, bytes]]:
    return [(f"r{i % 3}".encode(), f"event-{i}".encode()) for i in range(start, start + n)]


def test_read_returns_oldest_first_and_commit_consumes(tmp_path):
    spool = Spool(tmp_path, max_bytes=1 << 20)
    spool.append(records(5))
    batch = spool.read(max_records=3)
    assert [(r.key, r.value) for r in batch] == records(3)
    assert spool.read(max_records=3) == batch  # reading does not consume
    spool.commit(batch)
    assert [(r.key, r.value) for r in spool.read(max_records=10)] == records(2, start=3)
    assert spool.depth_records == 2


def test_reopen_keeps_unconsumed_records_and_the_cursor(tmp_path):
    spool = Spool(tmp_path, max_bytes=1 << 20)
    spool.append(records(4))
    spool.commit(spool.read(max_records=1))
    spool.close()
    reopened = Spool(tmp_path, max_bytes=1 << 20)
    assert [(r.key, r.value) for r in reopened.read(max_records=10)] == records(3, start=1)
    assert reopened.depth_records == 3
    assert reopened.depth_bytes == spool.depth_bytes


def test_torn_tail_is_cut_and_earlier_records_survive(tmp_path):
    spool = Spool(tmp_path, max_bytes=1 << 20)
    spool.append(records(3))
    spool.close()
    segment = next(tmp_path.glob("*.seg"))
    with open(segment, "ab") as f:
        f.write(b"\x00\x00\x01\x00garbage")  # a crash mid-append
    reopened = Spool(tmp_path, max_bytes=1 << 20)
    assert [(r.key, r.value) for r in reopened.read(max_records=10)] == records(3)
    reopened.append(records(1, start=3))
    assert [r.value for r in reopened.read(max_records=10)][-1] == b"event-3"


def test_corrupted_record_body_is_not_replayed(tmp_path):
    spool = Spool(tmp_path, max_bytes=1 << 20)
    spool.append(records(2))
    spool.close()
    segment = next(tmp_path.glob("*.seg"))
    data = bytearray(segment.read_bytes())
    data[-1] ^= 0xFF  # flip a bit in the last record
    segment.write_bytes(bytes(data))
    assert [r.value for r in Spool(tmp_path, max_bytes=1 << 20).read(max_records=10)] == [b"event-0"]


def test_full_spool_refuses_the_whole_batch(tmp_path):
    spool = Spool(tmp_path, max_bytes=200)
    spool.append(records(3))
    with pytest.raises(SpoolFull, match="do not fit"):
        spool.append([(b"k", b"x" * 200)])
    assert spool.depth_records == 3
    spool.commit(spool.read(max_records=3))
    spool.append([(b"k", b"x" * 150)])  # room again once consumed
    assert spool.depth_records == 1


def test_segments_roll_and_consumed_ones_are_deleted(tmp_path):
    spool = Spool(tmp_path, max_bytes=1 << 20, segment_bytes=100)
    for i in range(10):
        spool.append(records(2, start=2 * i))
    assert len(list(tmp_path.glob("*.seg"))) > 3
    everything = spool.read(max_records=100)
    assert [r.value for r in everything] == [v for _, v in records(20)]
    spool.commit(everything)
    assert len(list(tmp_path.glob("*.seg"))) <= 1
    assert spool.depth_records == 0 and spool.depth_bytes == 0
    spool.append(records(1, start=99))
    spool.close()
    assert [r.value for r in Spool(tmp_path, max_bytes=1 << 20).read(max_records=5)] == [b"event-99"]


def test_empty_batches_and_binary_values_round_trip(tmp_path):
    spool = Spool(tmp_path, max_bytes=1 << 20)
    spool.append([])
    spool.commit([])
    blob = bytes(range(256)) * 3
    spool.append([(b"", blob)])
    spool.close()
    [record] = Spool(tmp_path, max_bytes=1 << 20).read(max_records=5)
    assert (record.key, record.value) == (b"", blob)


def test_corrupt_cursor_file_is_reported_not_guessed(tmp_path):
    spool = Spool(tmp_path, max_bytes=1 << 20)
    spool.append(records(1))
    spool.close()
    (tmp_path / "cursor").write_text("not numbers")
    with pytest.raises(RuntimeError, match="cursor .* is corrupt"):
        Spool(tmp_path, max_bytes=1 << 20)


def test_bad_limits_are_refused(tmp_path):
    with pytest.raises(ValueError):
        Spool(tmp_path, max_bytes=0)


def test_a_second_opener_is_refused_until_the_first_closes(tmp_path):
    spool = Spool(tmp_path, max_bytes=1 << 20)
    with pytest.raises(SpoolLocked, match="in use by another gateway"):
        Spool(tmp_path, max_bytes=1 << 20)
    spool.close()
    Spool(tmp_path, max_bytes=1 << 20).close()
