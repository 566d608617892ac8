"""numpy's BLAS threads (``contracts/blas.py``): the processes tracelake owns (its faces, :mod:`tracelake.api`) start
none, the library packages leave them alone, and a count the user set is kept.

Each case is a child process (OpenBLAS reads its setting once, when numpy loads) that imports a package of
tracelake, then numpy, and reports the threads the operating system counts in it (``/proc/self/status``) and the
setting. The baseline is the same child where the user asked for two BLAS threads: OpenBLAS then starts one of
its own. The test compares the kernel's thread counts, not a figure of ours.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tracelake.contracts import blas

_CHILD = """
import json, os
import tracelake.%s
import numpy
threads = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("Threads:"))
print(json.dumps({"threads": threads, "setting": os.environ.get(%r)}))
"""


def _run(module: str, **env: str) -> dict[str, object]:
    clean = {k: v for k, v in os.environ.items() if k != blas.BLAS_THREADS_VARIABLE}
    out = subprocess.run([sys.executable, "-c", _CHILD % (module, blas.BLAS_THREADS_VARIABLE)],
                         env={**clean, **env}, capture_output=True, text=True, check=True).stdout
    return json.loads(out)


def _openblas_threads_start() -> bool:
    """Whether this machine shows OpenBLAS's threads: Linux's thread counts, and a core for a second thread."""
    return sys.platform.startswith("linux") and (os.cpu_count() or 1) >= 2


@pytest.mark.skipif(not _openblas_threads_start(), reason="Linux with two cores or more (OpenBLAS starts no "
                                                           "thread on one)")
def test_the_faces_start_no_blas_thread_and_a_user_setting_is_kept() -> None:
    ours = _run("api")
    theirs = _run("api", **{blas.BLAS_THREADS_VARIABLE: "2"})
    assert ours["setting"] == blas.BLAS_THREADS
    assert theirs["setting"] == "2"  # the user's value, not ours
    assert isinstance(ours["threads"], int) and isinstance(theirs["threads"], int)
    assert ours["threads"] == theirs["threads"] - 1, (ours, theirs)  # OpenBLAS's own thread is the difference


@pytest.mark.parametrize("module", ["warehouse", "ingest", "analysis"])
def test_the_library_leaves_blas_threads_to_the_user(module: str) -> None:
    assert _run(module)["setting"] is None
