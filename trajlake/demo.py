"""The end-to-end demo on the embedded default: every real component, one process.

embedded broker -> (workload batch through the SDK producer) + (toy agent
rollouts: OpenAI client -> gateway -> serve-model, tools/rewards through the
SDK) -> ingester -> Delta lake -> SQL -> build-dataset -> DeepSpeed training
on CPU -> checkpoint lineage -> harness A/B -> one scheduled run.

``run_demo`` yields ``(title, result)`` steps; ``trajlake demo`` renders them.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from devkit.broker import EmbeddedBroker
from ingest.ingester import IngesterConfig, ingest_until_idle
from ingest.producer import EventProducer
from ingest.sdk import TrajectoryClient
from devkit.workload import WorkloadConfig, generate_events
from schemas.control import CONTROL_TOPIC
from schemas.events import DEFAULT_TOPIC, Harness
from schemas.tables import EVENTS_TABLE, LLM_CALLS_VIEW, QUARANTINE_TABLE, ROLLOUTS_VIEW
from store.lake import Lake
from store.sql import run_query
from trajlake.background import serve_in_thread
from devkit.demo_agent import AgentSpec, run_rollout, token_sessions_before_after

DEMO_KEY = "demo-key"
DEMO_TENANT = "demo-team"
AGENT_VERSIONS = ("1.0", "1.1")

SQL_ANSWERS = {
    "events by type": f"SELECT type, count(*) AS events FROM {EVENTS_TABLE} GROUP BY type ORDER BY events DESC",
    "token-exact calls by harness": f"""
        SELECT harness_name, harness_version, count(*) AS calls, sum(n_prompt_tokens) AS prompt_tokens,
               sum(n_response_tokens) AS response_tokens, round(median(latency_ms), 1) AS p50_latency_ms
        FROM {LLM_CALLS_VIEW} GROUP BY ALL ORDER BY ALL""",
    "rollouts by status": f"""
        SELECT harness_name, status, count(*) AS rollouts, round(avg(reward), 3) AS mean_reward
        FROM {ROLLOUTS_VIEW} GROUP BY ALL ORDER BY ALL""",
    "quarantined events": f"SELECT count(*) AS quarantined FROM {QUARANTINE_TABLE}",
}


@dataclass(frozen=True)
class DemoConfig:
    workdir: Path
    workload_tasks: int = 12
    workload_rollouts_per_task: int = 4
    agent_tasks: int = 6
    agent_rollouts_per_task: int = 4
    seed: int = 7


def run_demo(config: DemoConfig) -> Iterator[tuple[str, Any]]:
    """Run every stage; yields a (title, result) pair per stage as it completes."""
    workdir = config.workdir.resolve()
    if workdir.exists():
        shutil.rmtree(workdir)
    workdir.mkdir(parents=True)
    lake = Lake(str(workdir / "lake"))
    with EmbeddedBroker(log_path=workdir / "broker.log") as broker:
        broker.create_topic(DEFAULT_TOPIC, partitions=4)
        broker.create_topic(CONTROL_TOPIC, partitions=1)
        yield "embedded broker", {"bootstrap_servers": broker.bootstrap_servers, "topic": DEFAULT_TOPIC}

        yield "workload batch through the SDK producer", _emit_workload(broker.bootstrap_servers, config)
        model_dir = _tiny_model()
        yield "tiny model", {"path": str(model_dir)}
        yield "agent rollouts through gateway -> serve-model", _run_agents(broker.bootstrap_servers, model_dir, config)

        stats = ingest_until_idle(
            IngesterConfig(lake=lake.root, bootstrap_servers=broker.bootstrap_servers, group="demo-ingest"),
            idle_s=3.0,
        )
        yield "ingested into Delta", {"consumed": stats.consumed, "events": stats.events,
                                       "quarantined": stats.quarantined, "duplicates_dropped": stats.duplicates,
                                       "rows": stats.rows, "lake": lake.root}
        yield "SQL answers", {title: run_query(lake, sql) for title, sql in SQL_ANSWERS.items()}
        yield "token sessions: demo-agent@1.0 before/after", _token_sessions(lake, model_dir)

        built = _build(lake, broker.bootstrap_servers)
        yield "dataset version", built
        record = _train(lake, model_dir, workdir, built.version)
        yield "trained checkpoint", record
        yield "checkpoint lineage", _lineage(lake, record.checkpoint_id)
        yield "harness A/B", _compare(lake)
        yield "scheduled run", _scheduled_run(lake, model_dir, workdir)


def _emit_workload(bootstrap: str, config: DemoConfig) -> dict[str, int]:
    workload = WorkloadConfig(tasks=config.workload_tasks, rollouts_per_task=config.workload_rollouts_per_task,
                              seed=config.seed, max_context_tokens=2000)
    sent = 0
    with EventProducer(bootstrap) as producer:
        for event in generate_events(workload):
            producer.send(event)
            sent += 1
        producer.flush()
    return {"rollouts": config.workload_tasks * config.workload_rollouts_per_task, "events": sent}


def _tiny_model() -> Path:
    from devkit.tiny_model import build_tiny_model, default_model_dir

    return build_tiny_model(default_model_dir())


def _run_agents(bootstrap: str, model_dir: Path, config: DemoConfig) -> dict[str, Any]:
    from openai import OpenAI
    from transformers import AutoTokenizer

    from ingest.gateway import create_gateway_app
    from serve.app import create_serve_app
    from trajlake.commands.gateway import GatewaySettings

    spool = config.workdir.resolve() / "gateway-spool"
    serve_app = create_serve_app(model_dir, served_name="tiny", policy_version="tiny-v0", seed=config.seed)
    with serve_in_thread(serve_app, name="serve-model") as engine_url:
        settings = GatewaySettings(upstream_url=f"{engine_url}/v1", bootstrap_servers=bootstrap,
                                   gateway_keys=f"{DEMO_KEY}={DEMO_TENANT}", spool_dir=spool,
                                   tokenizer=str(model_dir), token_sessions=True)
        with serve_in_thread(create_gateway_app(settings), name="gateway") as gateway_url:
            llm = OpenAI(base_url=f"{gateway_url}/v1", api_key=DEMO_KEY, max_retries=0)
            tokenizer = AutoTokenizer.from_pretrained(model_dir)
            rewards: dict[str, list[float]] = {v: [] for v in AGENT_VERSIONS}
            clients = {v: TrajectoryClient(bootstrap, tenant=DEMO_TENANT, harness=Harness(name="demo-agent", version=v))
                       for v in AGENT_VERSIONS}
            try:
                for task in range(config.agent_tasks):
                    for k in range(config.agent_rollouts_per_task):
                        version = AGENT_VERSIONS[k % len(AGENT_VERSIONS)]
                        spec = AgentSpec(harness_version=version)
                        rewards[version].append(run_rollout(
                            clients[version], llm, tokenizer, task_id=f"demo-task-{task}", rollout_id=f"demo-{task}-{k}",
                            spec=spec, seed=config.seed * 1000 + task * 10 + k))
            finally:
                for client in clients.values():
                    client.close()
    return {"rollouts": sum(len(r) for r in rewards.values()), "gateway": gateway_url, "engine": engine_url,
            "mean_reward": {v: round(sum(r) / len(r), 3) for v, r in rewards.items() if r}}


def _token_sessions(lake: Lake, model_dir: Path) -> dict[str, Any]:
    from transformers import AutoTokenizer

    return token_sessions_before_after(lake, AutoTokenizer.from_pretrained(model_dir))


def _build(lake: Lake, bootstrap: str):
    from kafka import KafkaProducer

    from pipelines import BuildConfig, Selection, build_dataset

    config = BuildConfig(selection=Selection(harnesses=("demo-agent",), tenants=(DEMO_TENANT,)), advantage="grpo")
    producer = KafkaProducer(bootstrap_servers=bootstrap)
    try:
        return build_dataset(lake, "demo", config, producer=producer)
    finally:
        producer.close()


def _train(lake: Lake, model_dir: Path, workdir: Path, version: int):
    from trainer.config import TrainConfig
    from trainer.loop import train_dataset

    config = TrainConfig(model=str(model_dir), out=str(workdir / "checkpoints"), lr=1e-4, epochs=2,
                         micro_batch_tokens=2048)
    return train_dataset(lake, "demo", version, config)


def _lineage(lake: Lake, checkpoint_id: str):
    from pipelines.lineage.trace import lineage

    return lineage(lake, checkpoint_id)


def _compare(lake: Lake):
    from pipelines.workbench.compare import Arm, CompareConfig, compare

    return compare(lake, Arm.parse("demo-agent@1.0"), Arm.parse("demo-agent@1.1"), CompareConfig())


def _scheduled_run(lake: Lake, model_dir: Path, workdir: Path) -> list:
    """The nightly job (build, then train) as the scheduler runs it at the next midnight UTC.

    The scheduler's clock is shifted forward to that midnight, so today's
    window (the demo's rollouts) is the one due.
    """
    from store.scheduler import Scheduler, utc_now
    from trajlake.commands.scheduler import SchedulerSettings, build_jobs

    now = utc_now()
    shift = now.replace(hour=0, minute=0, second=0, microsecond=0) + timedelta(days=1, seconds=1) - now
    settings = SchedulerSettings(lake=lake.root, scheduler_cron="0 0 * * *", scheduler_lag_h=0,
                                 scheduler_dataset="nightly", train_model=str(model_dir),
                                 train_out=str(workdir / "checkpoints"), retention_cron="", compact_cron="")
    scheduler = Scheduler(lake, build_jobs(lake, settings), owner="demo", clock=lambda: utc_now() + shift)
    return scheduler.run_pending()
