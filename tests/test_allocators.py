"""glibc's thresholds (``contracts/allocators.py``; docs/architecture.md, "Memory"): importing tracelake fixes them so
that a thread's arena hands a freed heap top back to the system, and a user's own setting is left alone.

Each case runs in a child process (glibc reads its environment variables once, at start), which frees 24 MiB in a
thread of its own and reports how much of it is still resident and how much of it was mapped apart from the heaps.
The baselines are the same child where the user set glibc's thresholds (so tracelake leaves them alone): as they
are once glibc's moving threshold has grown, and as they are in a fresh process. The test compares processes, not
a figure of ours.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tracelake.contracts import allocators

_CHILD = """
import ctypes, json, threading
import tracelake.%s
from tracelake.contracts import allocators
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
SIZE = 24 << 20

def resident_kib():
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon:"):
            return int(line.split()[1])

class Info(ctypes.Structure):  # glibc's struct mallinfo2
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                               "fsmblks", "uordblks", "fordblks", "keepcost")]
libc.mallinfo2.restype = Info
mapped = []

def work():
    before = libc.mallinfo2().hblkhd
    block = libc.malloc(SIZE)
    mapped.append(libc.mallinfo2().hblkhd - before)  # bytes of it mapped apart from the heaps
    ctypes.memset(block, 1, SIZE)
    libc.free(block)

before = resident_kib()
thread = threading.Thread(target=work)
thread.start()
thread.join()
print(json.dumps({"kept_kib": resident_kib() - before, "mapped": mapped[0], "set": allocators.fix_glibc_thresholds()}))
"""


def _on_glibc() -> bool:
    try:
        return sys.platform.startswith("linux") and bool(os.confstr("CS_GNU_LIBC_VERSION"))
    except (AttributeError, ValueError, OSError):  # no confstr, or a C library that does not know the name
        return False


_GLIBC = _on_glibc()


def _run(module: str, **env: str) -> dict[str, object]:
    clean = {k: v for k, v in os.environ.items() if k not in allocators.GLIBC_USER_SETTINGS and k != "GLIBC_TUNABLES"}
    out = subprocess.run([sys.executable, "-c", _CHILD % module], env={**clean, **env}, capture_output=True,
                         text=True, check=True).stdout
    return json.loads(out)


@pytest.mark.skipif(not _GLIBC, reason="glibc's allocator only")
@pytest.mark.parametrize("module", ["warehouse", "ingest", "analysis", "api"])
def test_a_thread_hands_its_freed_heap_back_once_tracelake_is_imported(module: str) -> None:
    ours = _run(module)
    # The user's own thresholds, as glibc's grown ones would be: the freed top stays with the thread's arena.
    theirs = _run(module, MALLOC_MMAP_THRESHOLD_=str(allocators.GLIBC_MMAP_THRESHOLD),
                  MALLOC_TRIM_THRESHOLD_=str(1 << 30))
    # glibc untouched, in a fresh process: its threshold has not grown yet, so the block is a mapping of its own.
    untouched = _run(module, MALLOC_TOP_PAD_=str(128 << 10))  # glibc's default top pad: a setting, the same value
    assert ours["set"] is True and theirs["set"] is False and untouched["set"] is False
    assert isinstance(ours["kept_kib"], int) and isinstance(theirs["kept_kib"], int)
    assert theirs["kept_kib"] > 20 * 1024, theirs  # the baseline keeps the 24 MiB: the test can tell the two apart
    assert ours["kept_kib"] < 6 * 1024, ours  # the freed 24 MiB went back (what stays is under 6 MiB)
    # and it came from the thread's heap, as big buffers do once glibc's threshold has grown (no page faults anew)
    assert untouched["mapped"] >= 24 << 20 and ours["mapped"] == 0, (untouched, ours)


@pytest.mark.skipif(not _GLIBC, reason="glibc's allocator only")
def test_glibc_tunables_for_malloc_are_left_alone() -> None:
    assert _run("warehouse", GLIBC_TUNABLES="glibc.malloc.trim_threshold=1073741824")["set"] is False


_KEPT_CHILD = """
import ctypes, json
import tracelake.warehouse
import pyarrow  # loaded before the count: leaving the context hands back Arrow's pool too
from tracelake.contracts import allocators
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
SIZE = 12 << 20  # under the kept threshold, over the usual one

def resident_kib():
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon:"):
            return int(line.split()[1])

def churn():
    block = libc.malloc(SIZE)
    ctypes.memset(block, 1, SIZE)
    libc.free(block)

before = resident_kib()
with allocators.freed_memory_kept():
    churn()
    inside = resident_kib() - before
    churn()  # the same pages again: nothing new
    again = resident_kib() - before
out = resident_kib() - before
churn()
print(json.dumps({"inside": inside, "again": again, "out": out, "after": resident_kib() - before}))
"""


@pytest.mark.skipif(not _GLIBC, reason="glibc's allocator only")
def test_freed_memory_is_kept_within_a_pass_and_handed_back_after_it() -> None:
    """Within ``freed_memory_kept`` a freed 12 MiB block stays resident for the next one to reuse; leaving hands it
    back, and a block freed after that goes back as it is freed (the usual threshold is restored)."""
    clean = {k: v for k, v in os.environ.items() if k not in allocators.GLIBC_USER_SETTINGS and k != "GLIBC_TUNABLES"}
    seen = json.loads(subprocess.run([sys.executable, "-c", _KEPT_CHILD], env=clean, capture_output=True, text=True,
                                     check=True).stdout)
    assert seen["inside"] > 10 * 1024 and seen["again"] < seen["inside"] + 2 * 1024, seen
    assert seen["out"] < 3 * 1024 and seen["after"] < 3 * 1024, seen


_MAPPED_CHILD = """
import ctypes, json
import tracelake.warehouse
from tracelake.contracts import allocators
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
SIZE = 3 << 19  # 1.5 MiB: over the mapped threshold, under the usual one

class Info(ctypes.Structure):  # glibc's struct mallinfo2
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                               "fsmblks", "uordblks", "fordblks", "keepcost")]
libc.mallinfo2.restype = Info

def resident_kib():
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon:"):
            return int(line.split()[1])

pins = []

def freed_below_a_live_block():
    '''A block written and freed while a small block made after it lives: not the heap's top. Its bytes mapped
    apart, and the KiB still resident once it is freed.'''
    before, mapped = resident_kib(), libc.mallinfo2().hblkhd
    block = libc.malloc(SIZE)
    ctypes.memset(block, 1, SIZE)
    pins.append(libc.malloc(64))
    mapped = libc.mallinfo2().hblkhd - mapped
    libc.free(block)
    return {"mapped": mapped, "kept_kib": resident_kib() - before}

with allocators.large_buffers_mapped():
    inside = freed_below_a_live_block()
after = freed_below_a_live_block()
print(json.dumps({"inside": inside, "after": after}))
"""


@pytest.mark.skipif(not _GLIBC, reason="glibc's allocator only")
def test_large_buffers_are_mapped_apart_within_the_context_and_from_the_heap_after_it() -> None:
    """Within ``large_buffers_mapped`` a 1.5 MiB block is a mapping of its own (glibc's own count of mapped bytes),
    so freeing it hands it back though a live block lies after it; after the context the same block comes from the
    heap and stays resident once freed (the usual threshold is restored)."""
    clean = {k: v for k, v in os.environ.items() if k not in allocators.GLIBC_USER_SETTINGS and k != "GLIBC_TUNABLES"}
    seen = json.loads(subprocess.run([sys.executable, "-c", _MAPPED_CHILD], env=clean, capture_output=True,
                                     text=True, check=True).stdout)
    assert seen["inside"]["mapped"] >= 3 << 19 and seen["inside"]["kept_kib"] < 512, seen
    assert seen["after"]["mapped"] == 0 and seen["after"]["kept_kib"] > 1024, seen
