"""The server's counters, rendered in the Prometheus text format for ``GET /metrics``."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable

from tracelake.contracts.status import FINAL_INGEST_STATUSES, IngestStatus

#: Upper bounds (seconds) of the ingest duration histogram's buckets.
INGEST_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, float("inf"))
#: Upper bounds (seconds) of the request duration histogram's buckets.
REQUEST_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, float("inf"))
#: The request methods counted under their own name; any other (a client may send any token) counts as ``other``,
#: so made-up methods cannot grow ``/metrics`` without bound.
HTTP_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"})
#: The method and route label of what is not in the allow-lists.
OTHER = "other"
#: Most route labels counted: the app has a few dozen route templates; this only backs up that count.
MAX_ROUTES = 200


class _Histogram:
    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * len(bounds)
        self.total = 0.0
        self.n = 0

    def observe(self, value: float) -> None:
        for i, bound in enumerate(self.bounds):
            if value <= bound:
                self.counts[i] += 1
                break
        self.total += value
        self.n += 1

    def lines(self, name: str, labels: str = "") -> list[str]:
        out, cumulative = [], 0
        sep = "," if labels else ""
        for bound, count in zip(self.bounds, self.counts):
            cumulative += count
            le = "+Inf" if bound == float("inf") else repr(bound)
            out.append(f'{name}_bucket{{{labels}{sep}le="{le}"}} {cumulative}')
        tail = f"{{{labels}}}" if labels else ""
        out += [f"{name}_sum{tail} {self.total!r}", f"{name}_count{tail} {self.n}"]
        return out


class Metrics:
    """Counters of uploads, ingests and requests; thread-safe (ingests finish on other threads)."""

    def __init__(self, queue_depth: Callable[[], int] = lambda: 0) -> None:
        self._lock = threading.Lock()
        self._queue_depth = queue_depth
        self.uploads = 0
        self.upload_bytes = 0
        self.rejected_uploads = 0
        self.ingests: Counter[str] = Counter()  # by outcome: ingested, duplicate, failed
        self.ingest_seconds = _Histogram(INGEST_BUCKETS)
        self.requests: Counter[tuple[str, str, int]] = Counter()
        self.request_seconds: dict[str, _Histogram] = {}

    def set_queue_depth(self, queue_depth: Callable[[], int]) -> None:
        """Where the queue depth gauge reads from."""
        self._queue_depth = queue_depth

    def upload(self, nbytes: int) -> None:
        """Count one accepted upload request of ``nbytes`` file bytes."""
        with self._lock:
            self.uploads += 1
            self.upload_bytes += nbytes

    def rejected(self) -> None:
        """Count one rejected upload request."""
        with self._lock:
            self.rejected_uploads += 1

    def ingest(self, outcome: str, seconds: float) -> None:
        """Count one finished ingest (``ingested``, ``duplicate`` or ``failed``) and its duration."""
        with self._lock:
            self.ingests[outcome] += 1
            if outcome == IngestStatus.INGESTED:
                self.ingest_seconds.observe(seconds)

    def request(self, method: str, route: str, status: int, seconds: float) -> None:
        """Count one HTTP request by method, route template and status.

        ``route`` must come from a bounded set (the app's route templates, ``unmatched``);
        past :data:`MAX_ROUTES` of them, new ones count as ``other``. A method outside
        :data:`HTTP_METHODS` is counted as ``other``.
        """
        method = method if method in HTTP_METHODS else OTHER
        with self._lock:
            if route not in self.request_seconds and len(self.request_seconds) >= MAX_ROUTES:
                route = OTHER
            self.requests[(method, route, status)] += 1
            self.request_seconds.setdefault(route, _Histogram(REQUEST_BUCKETS)).observe(seconds)

    def render(self) -> str:
        """Everything in the Prometheus text exposition format (version 0.0.4)."""
        depth = self._queue_depth()  # outside the lock: the queue has a lock of its own
        with self._lock:
            lines = [
                "# HELP tracelake_uploads_total Upload requests accepted.",
                "# TYPE tracelake_uploads_total counter",
                f"tracelake_uploads_total {self.uploads}",
                "# HELP tracelake_upload_bytes_total Bytes of trace files received in accepted uploads.",
                "# TYPE tracelake_upload_bytes_total counter",
                f"tracelake_upload_bytes_total {self.upload_bytes}",
                "# HELP tracelake_upload_rejections_total Upload requests refused (too large, bad archive, unknown format...).",
                "# TYPE tracelake_upload_rejections_total counter",
                f"tracelake_upload_rejections_total {self.rejected_uploads}",
                "# HELP tracelake_ingests_total Background ingests finished, by outcome.",
                "# TYPE tracelake_ingests_total counter",
            ]
            for outcome in FINAL_INGEST_STATUSES:
                lines.append(f'tracelake_ingests_total{{outcome="{outcome}"}} {self.ingests[outcome]}')
            lines += [
                "# HELP tracelake_ingest_failures_total Background ingests that failed.",
                "# TYPE tracelake_ingest_failures_total counter",
                f"tracelake_ingest_failures_total {self.ingests['failed']}",
                "# HELP tracelake_ingest_duration_seconds Time to ingest one trace file.",
                "# TYPE tracelake_ingest_duration_seconds histogram",
                *self.ingest_seconds.lines("tracelake_ingest_duration_seconds"),
                "# HELP tracelake_ingest_queue_depth Trace files queued or being ingested.",
                "# TYPE tracelake_ingest_queue_depth gauge",
                f"tracelake_ingest_queue_depth {depth}",
                "# HELP tracelake_http_requests_total HTTP requests, by method, route and status.",
                "# TYPE tracelake_http_requests_total counter",
            ]
            for (method, route, status), count in sorted(self.requests.items()):
                lines.append(
                    f'tracelake_http_requests_total{{method="{method}",route="{_escape(route)}",status="{status}"}} {count}'
                )
            lines += [
                "# HELP tracelake_http_request_duration_seconds Time to answer a request, by route.",
                "# TYPE tracelake_http_request_duration_seconds histogram",
            ]
            for route, histogram in sorted(self.request_seconds.items()):
                lines += histogram.lines("tracelake_http_request_duration_seconds", f'route="{_escape(route)}"')
        return "\n".join(lines) + "\n"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
