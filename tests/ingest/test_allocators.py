"""ingest.allocators: the settings reach Arrow when applied first, are reported late otherwise, never override."""

import json
import os
import subprocess
import sys

import pytest

from ingest import allocators

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
    assert got == {"late": [], "pool": "system", "jemalloc": allocators.ENVIRONMENT["_RJEM_MALLOC_CONF"]}


def test_too_late_once_arrow_is_loaded_and_left_unset():
    got = probe(before="import pyarrow")
    assert got["late"] == ["ARROW_DEFAULT_MEMORY_POOL"]
    assert got["pool"] != "system"


def test_an_operators_setting_wins():
    assert probe(ARROW_DEFAULT_MEMORY_POOL="mimalloc")["pool"] == "mimalloc"


def test_free_memory_trim_runs_at_most_every_interval():
    calls = []
    due, not_yet = allocators.FreeMemoryTrim(every_s=0.0), allocators.FreeMemoryTrim(every_s=3600.0)
    for trim in (due, not_yet):
        if trim._trim is None:  # not glibc: nothing to trim
            return
        trim._trim = lambda pad, trim=trim: calls.append((trim, pad))
    due(), due(), not_yet()
    assert calls == [(due, 0), (due, 0)]


MMAP_PROBE = """
import ctypes, json
{configure}
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes, libc.free.argtypes = ctypes.c_void_p, (ctypes.c_size_t,), (ctypes.c_void_p,)
class Mallinfo2(ctypes.Structure):  # hblkhd: bytes in blocks with mappings of their own
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd",
                                                           "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]
libc.mallinfo2.restype = Mallinfo2
libc.free(libc.malloc(4 << 20))  # glibc's own threshold rises to 4 MB here
before = libc.mallinfo2().hblkhd
block = libc.malloc(1 << 20)
print(json.dumps({{"own_mapping": libc.mallinfo2().hblkhd - before >= 1 << 20}}))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mmap threshold")
def test_big_blocks_keep_mappings_of_their_own_after_a_bigger_one_is_freed():
    def own_mapping(configure: str) -> bool:
        env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
        out = subprocess.run([sys.executable, "-c", MMAP_PROBE.format(configure=configure)], env=env,
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)["own_mapping"]

    assert own_mapping("from ingest import allocators; assert allocators.configure() == []")
    assert not own_mapping("")  # glibc's default: the threshold rose, the block came from the heap


JEMALLOC_PROBE = """
import os, tempfile
from ingest import allocators
assert allocators.configure() == []
os.environ["_RJEM_MALLOC_CONF"] += ",stats_print:true"  # jemalloc prints its options and statistics at exit
import pyarrow
from deltalake import write_deltalake
write_deltalake(tempfile.mkdtemp(), pyarrow.table({"a": [1]}))
"""


def test_delta_rs_jemalloc_takes_the_settings_with_its_arenas_capped():
    env = {k: v for k, v in os.environ.items() if k not in ("ARROW_DEFAULT_MEMORY_POOL", "_RJEM_MALLOC_CONF")}
    out = subprocess.run([sys.executable, "-c", JEMALLOC_PROBE], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "Invalid conf" not in out.stderr  # jemalloc ignores a setting it does not know, and says only this
    assert f"opt.narenas: {allocators.JEMALLOC_ARENAS}\n" in out.stderr
