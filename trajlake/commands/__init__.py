"""The commands of ``trajlake``: one module per concern, each exposing ``register(app)``.

``COMMANDS`` names every top-level command with its module and the summary ``trajlake --help`` lists for it (the
first paragraph of the command's help), in the order of that list. The shell imports a command's module only when
that command runs or shows its own help, so ``trajlake --help`` imports none of them (issue 16: building every
command cost --help 0.3 s of its 0.8 s). tests/trajlake/test_cli_commands.py checks the list against what the
modules register.
"""

from __future__ import annotations

from typing import NamedTuple


class Entry(NamedTuple):
    module: str
    """Module of ``trajlake.commands`` whose ``register(app)`` adds the command."""
    summary: str
    """First paragraph of the command's help, as ``trajlake --help`` lists it."""


COMMANDS: dict[str, Entry] = {
    "broker": Entry("broker", "Start the embedded broker (tansu) on 127.0.0.1 until Ctrl-C or SIGTERM."),
    "build-dataset": Entry("datasets", "Build a new version of datasets/NAME from the lake's rollouts and print its "
                                       "merge statistics."),
    "demo": Entry("demo", "Broker, SDK, gateway, serve-model, ingester, SQL, dataset, DeepSpeed training and lineage, "
                          "in one run."),
    "gateway": Entry("gateway", "Run the capture gateway: point any OpenAI client's base URL here and every call lands "
                                "in the lake."),
    "health": Entry("health", "Check that the lake can be listed (and, with --broker, that Kafka answers): exit 0 "
                              "healthy, 1 not."),
    "ingest": Entry("ingest", "Consume trajectory events and append them to the lake's Delta tables, exactly once."),
    "rebuild": Entry("ingest", "Re-derive the typed tables from the events table (one Delta version each). Stop the "
                               "ingesters first."),
    "lineage": Entry("lineage", "Trace an id down to rollouts, events and Kafka offsets, and up to dataset versions "
                                "and checkpoints."),
    "forget": Entry("ops", "Delete a tenant's, rollouts' or user's rows from every table, vacuum their files, audit "
                           "it."),
    "compact": Entry("ops", "Rewrite the small files written since the last run into few (--full: every file, "
                            "z-ordered), then vacuum; safe during ingestion."),
    "query-api": Entry("query_api", "Serve read-only SQL, rollouts, datasets and lineage over HTTP; each API key sees "
                                    "only its tenant's rows."),
    "scheduler": Entry("scheduler", "Run jobs on their cron windows, each window once across restarts and scheduler "
                                    "instances."),
    "runs": Entry("scheduler", "List scheduled runs: window, status, attempts, dataset version, checkpoint, error."),
    "serve-model": Entry("serve_model", "Serve a causal LM over an OpenAI-compatible API with vLLM-style token ids and "
                                        "logprobs."),
    "sql": Entry("sql", "Run SQL over every lake table (views: trajlake tables) and print or export the result."),
    "tables": Entry("sql", "List the views `trajlake sql` can query, with row counts and Delta versions."),
    "train": Entry("train", "Train on a dataset version with DeepSpeed and record the checkpoint and its lineage."),
    "checkpoints": Entry("train", "List trained checkpoints with their dataset version and final metrics, oldest "
                                  "first."),
    "failures": Entry("workbench", "Compile failure packets for failed or low-reward rollouts: constraints, steps "
                                   "around the failure, outcome."),
    "compare": Entry("workbench", "Compare B against A on the tasks both ran: success rate and mean reward, paired by "
                                  "task, with CI and p-value."),
    "datasets": Entry("datasets", "Versioned training datasets: list, show, diff, export."),
    "retention": Entry("ops", "Per-tenant retention of rollouts."),
    "rollout": Entry("rollout", "Inspect rollouts (one attempt at one task)."),
}
"""Top-level command -> where it lives and its summary, in ``trajlake --help`` order."""
