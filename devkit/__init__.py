"""What exists to develop, demo and benchmark trajlake, not to run it in production: the embedded
tansu broker, the synthetic workload generator, synthetic trainer data, the tiny model and its
tokenizer, the demo's chat harness.

The production packages (``ingest``, ``store``, ``pipelines``, ``trainer``, ``serve``, ``api``) never
import it; the ``trajlake`` shell does for its embedded defaults (``demo``, ``broker``, the tiny-model
fallback).
"""
