"""An answered call's events are durable before the answer leaves: a gateway killed right after answering
loses nothing (found by the mixed-fault soak, tests/soak: a call answered 0-50 ms before a SIGKILL was
missing from the log)."""

from __future__ import annotations

import threading

import httpx
from gateway_helpers import KEY, MemorySink, serve

from ingest.gateway import create_gateway_app
from ingest.gateway.emitter import Emitter
from ingest.spool import Spool


class HeldSink(MemorySink):
    """Takes a batch only once ``release`` is set; ``entered`` says a send is waiting."""

    def __init__(self) -> None:
        super().__init__()
        self.entered, self.release = threading.Event(), threading.Event()

    def send(self, records) -> None:
        self.entered.set()
        assert self.release.wait(60), "the test never released the sink"
        super().send(records)


def test_the_answer_waits_until_the_calls_events_are_acknowledged(settings, tmp_path):
    sink = HeldSink()
    emitter = Emitter(sink, Spool(tmp_path / "spool", max_bytes=1 << 20), retry_interval_s=0.05)
    answers: list[httpx.Response] = []
    with serve(create_gateway_app(settings, emitter=emitter)) as url:
        body = {"model": "fake-model", "messages": [{"role": "user", "content": "hold me"}]}
        call = threading.Thread(target=lambda: answers.append(httpx.post(
            f"{url}/v1/chat/completions", json=body, timeout=60,
            headers={"authorization": f"Bearer {KEY}", "idempotency-key": "held-1"})))
        call.start()
        assert sink.entered.wait(60)
        assert call.is_alive() and not answers  # events in flight, not acknowledged: no answer yet
        sink.release.set()
        call.join(60)
    assert answers and answers[0].status_code == 200
    assert len(sink.records) == 2  # llm.request and llm.response, acknowledged before the answer
