"""Fixtures for the pipeline tests: a writer of typed lake rows, a real tokenizer with a chat template."""

from __future__ import annotations

import uuid
from collections import defaultdict
from datetime import datetime, timedelta, timezone

import pyarrow as pa
import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from schemas.tables import TYPED_TABLES
from store.lake import Lake

SCHEMAS = {name: schema for name, schema in TYPED_TABLES.values()}
T0 = datetime(2026, 11, 1, tzinfo=timezone.utc)

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


class LakeRows:
    """Buffers typed-table rows for rollouts, calls and rewards; ``flush`` appends them to the lake."""

    def __init__(self, lake: Lake) -> None:
        self.lake = lake
        self.rows: dict[str, list[dict]] = defaultdict(list)
        self.keys: dict[str, dict] = {}
        self.seq: dict[str, int] = defaultdict(int)
        self.offset = 0

    def _row(self, rollout_id: str, ts: datetime | None = None, **fields) -> dict:
        self.seq[rollout_id] += 1
        self.offset += 1
        return {
            **self.keys[rollout_id],
            "event_id": str(uuid.uuid4()),
            "ts": ts or T0 + timedelta(seconds=self.offset),
            "seq": self.seq[rollout_id],
            "span_id": None,
            "parent_span_id": None,
            "kafka_topic": "trajlake.events",
            "kafka_partition": 0,
            "kafka_offset": self.offset,
            **fields,
        }

    def rollout(self, rollout_id: str, task_id: str, *, tenant: str = "acme", group_id: str | None = None,
                policy_version: str | None = "p1", harness: tuple[str, str] = ("swe", "1.0"),
                status: str | None = "succeeded", started: datetime | None = None) -> None:
        self.keys[rollout_id] = {"tenant": tenant, "task_id": task_id, "rollout_id": rollout_id, "attempt": 0,
                                 "harness_name": harness[0], "harness_version": harness[1],
                                 "harness_config_hash": "cfg"}
        self.rows["rollout_starts"].append(self._row(rollout_id, started, group_id=group_id or task_id,
                                                     policy_version=policy_version, metadata="{}"))
        if status is not None:
            self.finish(rollout_id, status)

    def finish(self, rollout_id: str, status: str = "succeeded") -> None:
        self.rows["rollout_ends"].append(self._row(rollout_id, status=status, reason=None, steps=1))

    def call(self, rollout_id: str, call_id: str, prompt: list[int] | None, response: list[int] | None,
             logprobs: list[float] | None = None, *, token_source: str = "engine", span_id: str | None = None,
             idempotency_key: str | None = None, template: str = "chatml-1", tokenizer: str = "tiny-bpe",
             error: str | None = None, finish_reason: str = "stop", respond: bool = True) -> None:
        if logprobs is None and response is not None:
            logprobs = [-0.5] * len(response)
        self.rows["llm_requests"].append(self._row(
            rollout_id, call_id=call_id, model="m", messages=None, prompt=None, tools=None, params="{}",
            prompt_token_ids=prompt, n_prompt_tokens=None if prompt is None else len(prompt), tokenizer=tokenizer,
            chat_template_hash=template, idempotency_key=idempotency_key, span_id=span_id))
        if respond:
            self.rows["llm_responses"].append(self._row(
                rollout_id, call_id=call_id, text="", tool_calls=None, finish_reason=finish_reason,
                response_token_ids=response, logprobs=logprobs,
                n_response_tokens=None if response is None else len(response), token_source=token_source,
                usage=None, latency_ms=1.0, upstream_retries=0, policy_version="p1", error=error, span_id=span_id))

    def reward(self, rollout_id: str, value: float, *, name: str = "score", ts: datetime | None = None) -> str:
        row = self._row(rollout_id, ts, name=name, value=value, source="test")
        self.rows["rewards"].append(row)
        return row["event_id"]

    def flush(self) -> None:
        for table, schema in SCHEMAS.items():
            rows = self.rows.pop(table, [])
            if rows or not self.lake.exists(table):
                self.lake.append(table, pa.Table.from_pylist(rows, schema=schema), schema=schema)


@pytest.fixture
def rows(lake: Lake) -> LakeRows:
    return LakeRows(lake)


@pytest.fixture(scope="session")
def chat_tokenizer() -> PreTrainedTokenizerFast:
    """A tiny byte-level BPE trained here, with a ChatML chat template."""
    words = ("the agent reads the file and runs the tests then fixes the bug in parser module "
             "tool result output error passed failed summary of previous steps user assistant system").split()
    corpus = [" ".join(words[(i * 7 + j) % len(words)] for j in range(12)) for i in range(400)]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=["<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=None, eos_token="<|im_end|>")
    fast.chat_template = CHATML
    return fast
