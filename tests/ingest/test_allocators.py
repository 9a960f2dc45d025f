"""ingest.allocators: the settings reach Arrow when applied first, are reported late otherwise, never override."""

import json
import os
import subprocess
import sys

PROBE = """
import json, os, sys
{before}
from ingest import allocators
late = allocators.configure()
import pyarrow
print(json.dumps({{"late": late, "pool": pyarrow.default_memory_pool().backend_name,
                  "jemalloc": os.environ.get("_RJEM_MALLOC_CONF")}}))
"""


def probe(before: str = "", **env: str) -> dict:
    clean = {k: v for k, v in os.environ.items() if k not in ("ARROW_DEFAULT_MEMORY_POOL", "_RJEM_MALLOC_CONF")}
    out = subprocess.run([sys.executable, "-c", PROBE.format(before=before)], env={**clean, **env},
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_applied_before_the_libraries_load():
    got = probe()
    assert got == {"late": [], "pool": "system", "jemalloc": "tcache:false,dirty_decay_ms:0,muzzy_decay_ms:0"}


def test_too_late_once_arrow_is_loaded_and_left_unset():
    got = probe(before="import pyarrow")
    assert got["late"] == ["ARROW_DEFAULT_MEMORY_POOL"]
    assert got["pool"] != "system"


def test_an_operators_setting_wins():
    assert probe(ARROW_DEFAULT_MEMORY_POOL="mimalloc")["pool"] == "mimalloc"
