"""A lean HTTP/1.1 keep-alive load generator (asyncio streams), so the client costs little CPU.

Open loop (``at_rate``): requests start on a fixed schedule whatever the
latency, and latency counts from the scheduled start (queueing included).
Closed loop (``saturate``): ``concurrency`` connections send back to back.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class Target:
    host: str
    port: int
    path: str
    headers: dict[str, str]
    body: bytes

    def request(self) -> bytes:
        lines = [f"POST {self.path} HTTP/1.1", f"host: {self.host}:{self.port}", "content-type: application/json",
                 f"content-length: {len(self.body)}"]
        lines += [f"{k}: {v}" for k, v in self.headers.items()]
        return ("\r\n".join(lines) + "\r\n\r\n").encode() + self.body


class Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, target: Target) -> Connection:
        return cls(*await asyncio.open_connection(target.host, target.port))

    async def exchange(self, raw: bytes) -> int:
        """Send one request, read one whole response; returns the status."""
        self.writer.write(raw)
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        length = 0
        for line in head.split(b"\r\n"):
            if line[:15].lower() == b"content-length:":
                length = int(line[15:])
        await self.reader.readexactly(length)
        return status

    def close(self) -> None:
        self.writer.close()


@dataclass(frozen=True)
class RunResult:
    latencies_s: list[float]
    errors: int
    elapsed_s: float


async def at_rate(target: Target, *, rate: float, seconds: float) -> RunResult:
    raw = target.request()
    pool: list[Connection] = []
    latencies: list[float] = []
    errors = 0

    async def one(scheduled: float) -> None:
        nonlocal errors
        conn = pool.pop() if pool else await Connection.open(target)
        status = await conn.exchange(raw)
        latencies.append(time.perf_counter() - scheduled)
        errors += status != 200
        pool.append(conn)

    start = time.perf_counter()
    tasks = []
    for i in range(int(rate * seconds)):
        scheduled = start + i / rate
        delay = scheduled - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(scheduled)))
    await asyncio.gather(*tasks)
    elapsed = time.perf_counter() - start
    for conn in pool:
        conn.close()
    return RunResult(latencies, errors, elapsed)


async def saturate(target: Target, *, concurrency: int, seconds: float) -> RunResult:
    raw = target.request()
    latencies: list[float] = []
    errors = 0
    stop = time.perf_counter() + seconds

    async def worker() -> None:
        nonlocal errors
        conn = await Connection.open(target)
        while time.perf_counter() < stop:
            t = time.perf_counter()
            status = await conn.exchange(raw)
            latencies.append(time.perf_counter() - t)
            errors += status != 200
        conn.close()

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return RunResult(latencies, errors, time.perf_counter() - start)
