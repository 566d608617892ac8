"""Allocator settings that must be in place before the data libraries load.

polars allocates through its own jemalloc (symbols prefixed ``_rjem_``), which by default keeps
freed pages for about ten seconds before handing them back to the system. Ingest works in
windows: each window's frames are freed as the next one comes, and with that default the
windows' freed pages stay counted in the process's resident memory until the trace is done
(docs/architecture.md, "Memory"). With the decays at 0 they go back at once: on a 1 GB
Kineto trace the ingest's peak RSS fell by about 5% (622 to 592 MB, mean of 3 runs each,
alternating), at the same time; the windows' own growth fell from 240 to 60 MB. jemalloc reads ``_RJEM_MALLOC_CONF`` once, when polars loads,
so the packages that load the data libraries (:mod:`tracelake.api`, :mod:`tracelake.warehouse`, and
:mod:`tracelake.ingest` and :mod:`tracelake.analysis` for those who use them as a library) call
:func:`return_freed_memory_promptly` before anything imports polars. A value the user set is
kept. This module imports nothing of the project's.

Arrow's default pool (mimalloc) keeps freed pages too, and trimming between the steps of an ingest
does not reach what it holds during one: the system allocator instead took the peak of a 1 GB
generated Kineto trace with memory instants from 518 to 456 MiB (two alternating runs each, CPU time
within the noise), where mimalloc's own prompt purging (``MIMALLOC_PURGE_DELAY=0``) took it to 467 MiB
for 0.5-1.3 s more CPU. Arrow reads ``ARROW_DEFAULT_MEMORY_POOL`` once, at its first allocation, so the
same call sets it before pyarrow loads.
"""

from __future__ import annotations

import os

#: The variable polars' jemalloc reads its options from.
POLARS_JEMALLOC_VARIABLE = "_RJEM_MALLOC_CONF"
#: Freed pages go back to the system at once (dirty and muzzy decay of 0 ms).
POLARS_JEMALLOC_OPTIONS = "dirty_decay_ms:0,muzzy_decay_ms:0"


#: The variable Arrow reads its default memory pool from, and the pool: the system's allocator.
ARROW_POOL_VARIABLE = "ARROW_DEFAULT_MEMORY_POOL"
ARROW_POOL = "system"


def return_freed_memory_promptly() -> None:
    """Have polars' and Arrow's allocators return freed memory at once, unless the user configured them already."""
    os.environ.setdefault(POLARS_JEMALLOC_VARIABLE, POLARS_JEMALLOC_OPTIONS)
    os.environ.setdefault(ARROW_POOL_VARIABLE, ARROW_POOL)
