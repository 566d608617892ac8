"""Each job's analysis as JSON, kept ready while the job's traces stay the same.

``GET /api/v1/jobs/{job}`` answers from here. An answer is keyed by the job's
trace ids and the modification times of their stored analyses, so a new, deleted
or recomputed trace is a miss. When an upload's ingest finishes, the job's answer
is computed in the background, so that the next request finds it ready.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor

from tracelake.contracts.critical import Speedup
from tracelake.warehouse import NotFound, TracelakeError, Warehouse

from .responses import encode

log = logging.getLogger(__name__)

#: Answers kept (least recently used ones go first).
ENTRIES = 256
#: The kernel ranking length answers are prepared with (the API's default).
DEFAULT_TOP = 8


class JobAnalyses:
    """Computes and keeps the JSON analysis of jobs."""

    def __init__(self, warehouse: Warehouse, entries: int = ENTRIES) -> None:
        self.warehouse = warehouse
        self.entries = entries
        self._answers: OrderedDict[tuple[object, ...], bytes] = OrderedDict()
        self._lock = threading.Lock()
        self._warmer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tracelake-warm")

    def get(self, job: str, top: int = DEFAULT_TOP, speedups: tuple[Speedup, ...] = ()) -> bytes:
        """The job's analysis as JSON bytes (with a what-if scenario per speedup).

        Raises:
            NotFound: the job has no traces.
        """
        key = (*self._key(job, top), speedups)
        with self._lock:
            body = self._answers.get(key)
            if body is not None:
                self._answers.move_to_end(key)
                return body
        body = self._compute(job, top, speedups, traces=len(key[2]))
        with self._lock:
            self._answers[key] = body
            while len(self._answers) > self.entries:
                self._answers.popitem(last=False)
        return body

    def prepared(self) -> list[bytes]:
        """The answers kept ready now, least recently used first (what a request would find without computing)."""
        with self._lock:
            return list(self._answers.values())

    def warm(self, job: str) -> None:
        """Prepare the job's answer in the background (after an ingest into it)."""
        self._warmer.submit(self._warm, job)

    def close(self) -> None:
        """Stop preparing answers."""
        self._warmer.shutdown(wait=False, cancel_futures=True)

    def _warm(self, job: str) -> None:
        try:
            self.get(job)
        except TracelakeError as exc:
            log.debug("cannot prepare the analysis of job %s: %s", job, exc)

    def _key(self, job: str, top: int) -> tuple[str, int, tuple[str, ...], tuple[int, ...]]:
        store = self.warehouse.store
        ids = store.job_traces(job)
        if not ids:
            raise NotFound(f"no traces in job {job!r}")
        stamps = []
        for trace_id in ids:
            try:
                stamps.append(store.path("breakdown", job, trace_id).stat().st_mtime_ns)
            except OSError:
                stamps.append(0)
        return (job, top, tuple(ids), tuple(stamps))

    def _compute(self, job: str, top: int, speedups: tuple[Speedup, ...], *, traces: int) -> bytes:
        analysis = self.warehouse.analyze(job=job, top=top, speedups=speedups).as_dict()
        main = {name: analysis.pop(name) for name in ("runs", "findings", "breakdown", "last_arrivals", "top_kernels",
                                                      "critical_path", "critical_path_stretches", "what_if",
                                                      "parallelism", "pipeline_bubbles", "memory")}
        return encode({"job": job, "traces": traces, **main, "analysis": analysis})
