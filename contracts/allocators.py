"""Allocator settings that must be in place before the data libraries load, and the call that hands freed memory
back between the steps of an ingest (:func:`release_free_memory`): the one module that knows the allocators.

polars allocates through its own jemalloc (symbols prefixed ``_rjem_``), which by default keeps freed pages for
about ten seconds before handing them back to the system. Ingest works in windows: each window's frames are freed as
the next one comes, and with that default the windows' freed pages stay counted in the process's resident memory
until the trace is done (docs/architecture.md, "Memory"). With the decays at 0 they go back at once: on a 1 GB
Kineto trace the ingest's peak RSS fell by about 5% (622 to 592 MB, mean of 3 runs each, alternating), at the same
time; the windows' own growth fell from 240 to 60 MB. The dirty decay is 100 ms now, not 0: with 0, every window's
frames faulted their pages in afresh (each window of a rank allocates what the one before it freed), and on a 30 MB
TPU profile the stored analyses took 0.63-0.69 s of one thread where they take 0.49-0.53 s when freed pages are
kept. Kept for 100 ms, the next window reuses them and the trace's end hands them back: the 30 MB TPU ingest 6-10%
faster for 4-7 MB more at its peak, the 1 GB Qwen-shaped Kineto trace's peak level (322 MB against 321, 2026-12-07).
And one arena (``narenas:1``), not one per thread up to four per core: a page one thread frees is the next one's to
take, where an arena per thread kept each thread's freed pages apart (and a purging thread each). Six alternating
ingests of each on the 30 MB TPU profile: peaks 222 MB the median, 225 the largest, against 228 and 231 with an
arena per thread, at the same time (0.92 s); level on the 100 MB TPU profile, the 30 MB GPU one (its largest peak
229 MB against 264) and the 1 GB Qwen shape. jemalloc reads ``_RJEM_MALLOC_CONF`` once, when polars loads, so the
packages that load the data libraries (:mod:`tracelake.api`, :mod:`tracelake.warehouse`, and :mod:`tracelake.ingest`
and :mod:`tracelake.analysis` for those who use them as a library) call :func:`return_freed_memory_promptly` before
anything imports polars. A value the user set is kept. This module imports nothing of the project's.

Arrow's default pool (mimalloc) keeps freed pages too, and trimming between the steps of an ingest
does not reach what it holds during one: the system allocator instead took the peak of a 1 GB
generated Kineto trace with memory instants from 518 to 456 MiB (two alternating runs each, CPU time
within the noise), where mimalloc's own prompt purging (``MIMALLOC_PURGE_DELAY=0``) took it to 467 MiB
for 0.5-1.3 s more CPU. Arrow reads ``ARROW_DEFAULT_MEMORY_POOL`` once, at its first allocation, so the
same call sets it before pyarrow loads.

glibc's own allocator (Arrow's pool now, numpy, DuckDB, the parsers) raises its mmap threshold up to 32 MiB as
it sees large buffers freed, and with it the size a heap's free top must reach before it is handed back (twice
the threshold): each thread's arena then keeps up to 64 MiB of freed memory, and ``malloc_trim`` does not touch
the top of a thread's arena, only the main one's. An ingest starts and ends many threads (DuckDB's workers, the
read-ahead and writer threads), and the arenas of the finished ones kept their freed tops: on a 2 GB Kineto trace
120 MiB of the process's memory before the stored analyses, of which 20 MiB in use. So the same call fixes both
thresholds (``mallopt``): buffers up to 32 MiB from the heaps, as the grown threshold had them, and a heap's free
top above 2 MiB handed back as it forms. The peaks fell by 40-70 MiB on the 2 GB Kineto trace and by 15-30 MiB on
30 MB XLA files, at the same time within the runs' spread (2 MiB rather than 4: 5-10 MiB less on the 30 MB GPU
file, the same on the Kineto ones) (docs/architecture.md, "Memory"). Not done where the
user set any of glibc's thresholds (``MALLOC_TRIM_THRESHOLD_``, ``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TOP_PAD_``,
``MALLOC_MMAP_MAX_``, or ``malloc.`` tunables in ``GLIBC_TUNABLES``), nor on another C library. The capture hooks
(:mod:`tracelake.client`, ``tracelake.torch``, ``tracelake.jax``) import none of the packages that call this, so a
training process keeps glibc's own settings.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Iterator
from contextlib import contextmanager

#: The variable polars' jemalloc reads its options from.
POLARS_JEMALLOC_VARIABLE = "_RJEM_MALLOC_CONF"
#: Freed pages go back to the system within 100 ms (dirty decay), once there at once (muzzy decay of 0 ms); one
#: arena for every thread.
POLARS_JEMALLOC_OPTIONS = "dirty_decay_ms:100,muzzy_decay_ms:0,narenas:1"


#: The variable Arrow reads its default memory pool from, and the pool: the system's allocator.
ARROW_POOL_VARIABLE = "ARROW_DEFAULT_MEMORY_POOL"
ARROW_POOL = "system"


#: glibc's ``mallopt`` parameters, and the values set: a heap's free top above 2 MiB goes back to the system, and
#: buffers below 32 MiB (glibc's own ceiling for its moving threshold) come from the heaps.
GLIBC_M_TRIM_THRESHOLD, GLIBC_M_MMAP_THRESHOLD = -1, -3
GLIBC_TRIM_THRESHOLD = 2 << 20
GLIBC_MMAP_THRESHOLD = 32 << 20
#: The trim threshold within :func:`freed_memory_kept`: a pass's per-row-group buffers stay on the heap between groups.
GLIBC_KEPT_TRIM_THRESHOLD = 16 << 20
#: The mmap threshold within :func:`large_buffers_mapped`: buffers of a MiB and more are mapped apart.
GLIBC_MAPPED_THRESHOLD = 1 << 20
#: The environment through which a user sets glibc's thresholds themselves: then they are left alone.
GLIBC_USER_SETTINGS = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_")
GLIBC_TUNABLES_VARIABLE = "GLIBC_TUNABLES"

_glibc_set: bool | None = None  # None: not tried yet in this process


def return_freed_memory_promptly() -> None:
    """Have polars', Arrow's and glibc's allocators return freed memory promptly, unless the user configured them
    already."""
    os.environ.setdefault(POLARS_JEMALLOC_VARIABLE, POLARS_JEMALLOC_OPTIONS)
    os.environ.setdefault(ARROW_POOL_VARIABLE, ARROW_POOL)
    fix_glibc_thresholds()


def fix_glibc_thresholds() -> bool:
    """Fix glibc's trim and mmap thresholds (:data:`GLIBC_TRIM_THRESHOLD`, :data:`GLIBC_MMAP_THRESHOLD`) once per
    process; True where they are set (now or before), False on another C library or where the user set their own."""
    global _glibc_set
    if _glibc_set is None:
        _glibc_set = _set_glibc_thresholds()
    return _glibc_set


def _set_glibc_thresholds() -> bool:
    tunables = os.environ.get(GLIBC_TUNABLES_VARIABLE, "")
    if any(name in os.environ for name in GLIBC_USER_SETTINGS) or "malloc." in tunables or _GLIBC is None:
        return False
    mallopt = _GLIBC.mallopt
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(GLIBC_M_MMAP_THRESHOLD, GLIBC_MMAP_THRESHOLD)) and \
        bool(mallopt(GLIBC_M_TRIM_THRESHOLD, GLIBC_TRIM_THRESHOLD))


@contextmanager
def freed_memory_kept() -> Iterator[None]:
    """Within: up to :data:`GLIBC_KEPT_TRIM_THRESHOLD` of a heap's free top is kept, not handed back as it forms;
    after: the threshold of :func:`fix_glibc_thresholds` again, and what was freed handed back
    (:func:`release_free_memory`).

    For a pass that allocates and frees the same buffers for each of many row groups: with the heap's top handed
    back above 2 MiB, each group faulted its buffers' pages in afresh (the operators' pass at 8 GB of Kineto trace:
    213 row groups, 1 s more of its 6; docs/architecture.md, "Memory"). Those pages are part of the pass's peak
    anyway. Nothing is changed where :func:`fix_glibc_thresholds` left glibc alone.
    """
    with _glibc_set_within(GLIBC_M_TRIM_THRESHOLD, GLIBC_KEPT_TRIM_THRESHOLD, GLIBC_TRIM_THRESHOLD) as changed:
        try:
            yield
        finally:
            if changed:
                release_free_memory()


@contextmanager
def large_buffers_mapped() -> Iterator[None]:
    """Within: buffers of :data:`GLIBC_MAPPED_THRESHOLD` and more are mapped apart from the heaps, and go back to the
    system as they are freed; after: the threshold of :func:`fix_glibc_thresholds` again.

    For a pass whose buffers of that size are made on one thread and freed on another, beside small blocks that
    live longer: DuckDB's Arrow batches (each text column's characters grown by ``realloc`` on DuckDB's workers,
    freed once the batch is written) left holes in the workers' heaps that grew with the rows read. Alone on the
    8 GB Qwen shape's device ops (kernel names of 380 characters: 1-2 MiB a batch) the merge peaked 20-30 MiB
    lower, for 0.15-0.25 s more of its 1.7-1.9 s (docs/architecture.md, "Memory"). Lower thresholds cost more than
    they gave: at 256 KiB the host ops' merge took 25% longer. Nothing is changed where :func:`fix_glibc_thresholds`
    left glibc alone.
    """
    with _glibc_set_within(GLIBC_M_MMAP_THRESHOLD, GLIBC_MAPPED_THRESHOLD, GLIBC_MMAP_THRESHOLD):
        yield


@contextmanager
def _glibc_set_within(parameter: int, inside: int, after: int) -> Iterator[bool]:
    """glibc's ``mallopt`` ``parameter`` at ``inside`` within, at ``after`` (the value :func:`fix_glibc_thresholds`
    sets) after; yields whether it was changed (not where that call left glibc alone)."""
    glibc = _GLIBC if fix_glibc_thresholds() else None
    if glibc is not None:
        glibc.mallopt(parameter, inside)
    try:
        yield glibc is not None
    finally:
        if glibc is not None:
            glibc.mallopt(parameter, after)


def release_free_memory() -> None:
    """Hand the memory freed so far back to the system (the allocators keep it otherwise).

    After the batches are scanned, glibc (in the loader threads' arenas) and Arrow's
    allocator hold on to the scanner's and the Parquet writer's freed buffers, up to
    about 100 MB; the out-of-core steps that follow would otherwise peak that much
    higher. glibc's part (``malloc_trim``: the free chunks inside every arena, and the main heap's top) is only
    released on glibc.
    """
    import pyarrow as pa  # here: this module runs before pyarrow may load (see above)

    pa.default_memory_pool().release_unused()  # Arrow's own allocator (mimalloc), where a user chose it
    if _GLIBC is not None:
        _GLIBC.malloc_trim(0)


def _find_glibc() -> ctypes.CDLL | None:
    """The C library where it is glibc (whose ``mallopt`` and ``malloc_trim`` are meant here), else None."""
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018 - glibc only: musl has mallopt with other meanings
        libc.malloc_trim  # noqa: B018
        libc.mallopt  # noqa: B018
    except (OSError, AttributeError):
        return None
    return libc


_GLIBC = _find_glibc()
