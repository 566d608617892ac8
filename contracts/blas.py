"""numpy's BLAS threads in the processes tracelake owns: the ``tracelake`` command, its server and its scheduler.

numpy's wheels link OpenBLAS, which starts a thread per core but one when it loads and keeps them spinning for a
while, waiting for work, then again after every matrix product. tracelake calls no BLAS routine (its numpy work is
sorting, searching and element-wise arithmetic on one-dimensional arrays), so those threads only spin: each process
of the command spent 0.12 CPU s on them after importing numpy (``import numpy`` then half a second of sleep: 0.21
user CPU s against 0.09 with one thread, on the two-core development machine), CPU an ingest's own threads wanted
(docs/architecture.md, "Memory"). OpenBLAS reads ``OPENBLAS_NUM_THREADS`` once, when it loads, so
:mod:`tracelake.api` (the faces: the command line, the REST server, the scheduler) calls :func:`one_blas_thread`
before anything imports numpy. A value the user set is kept.

The library packages (:mod:`tracelake.warehouse`, :mod:`tracelake.ingest`, :mod:`tracelake.analysis`) do not call
it: a notebook or a Dask worker that imports them may run BLAS work of its own. This module imports nothing of the
project's.
"""

from __future__ import annotations

import os

#: The variable OpenBLAS reads its thread count from, and the count set: the calling thread alone.
BLAS_THREADS_VARIABLE = "OPENBLAS_NUM_THREADS"
BLAS_THREADS = "1"


def one_blas_thread() -> None:
    """Have OpenBLAS (numpy's BLAS) start no threads of its own, unless the user set their count."""
    os.environ.setdefault(BLAS_THREADS_VARIABLE, BLAS_THREADS)
