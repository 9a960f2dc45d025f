"""Benchmarks: one package per subject under ``bench/<name>/``, each a script that measures
a ratio against a baseline taken in the same run (never absolute timings in tests)."""
