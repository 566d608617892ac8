"""The client of a tracelake server (:class:`Client`): upload traces, follow them, read a job's analyses and run SQL.

It imports only the standard library and :mod:`tracelake.contracts.errors` (polars inside the
methods that answer frames, ISA-L when it is there), never the server, DuckDB or the warehouse,
so a training job or a CI step can import it cheaply::

    from tracelake.client import Client

    client = Client()                       # TRACELAKE_URL, TRACELAKE_TOKEN
    report = client.upload("runs/42/", job="llama-70b", labels={"team": "infra"}, wait=True)
    frames = client.job("llama-70b")        # {"breakdown": DataFrame, "findings": ..., ...}
    client.sql("SELECT rank, count(*) FROM device_ops GROUP BY ALL")

Uploads are idempotent: each file's trace id (the SHA-256 of its decoded content, as the
server computes it; docs/formats.md, "Trace ids") is computed here first and asked for, so a
file the server has, or is ingesting, is not sent again. Files are streamed from disk, never
held whole in memory. Connection errors, 408 and 5xx answers are retried with exponential
backoff and jitter; 429 and 503 wait as long as the server's ``Retry-After`` says.
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import random
import socket
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Protocol
from urllib.parse import quote, urlencode, urlsplit

from tracelake.contracts.errors import ServerError
from tracelake.contracts.names import check_job, check_labels

from .files import ARCHIVE_SUFFIXES, CHUNK, content_id, trace_files

if TYPE_CHECKING:
    import polars as pl

__all__ = ["Client", "ServerError", "Sent", "UploadProgress", "UploadReport", "content_id", "trace_files"]

log = logging.getLogger(__name__)

_DONE, _FAILED = "done", "failed"
DEFAULT_URL = "http://127.0.0.1:8000"

class UploadProgress(Protocol):
    """What :meth:`Client.upload` reports as it goes (the CLI's progress bar is one)."""

    def start(self, files: list[tuple[Path, int]]) -> None:
        """The files about to be sent, with their sizes."""

    def file_started(self, path: Path) -> None:
        """A file's turn has come."""

    def advance(self, nbytes: int) -> None:
        """Bytes sent (negative: a retry starts the file again)."""

    def file_done(self, item: Sent) -> None:
        """A file was sent, skipped or failed."""


@dataclass
class Sent:
    """What became of one file of an upload.

    ``status`` is the server's (``queued``, ``ingesting``, ``done``, ``failed``); ``sent`` is False
    when the server had the trace already and nothing was uploaded.
    """

    path: Path
    trace_id: str | None
    status: str
    sent: bool
    job: str | None = None
    error: str | None = None
    bytes: int = 0
    #: The trace ids an archive became (one per trace file in it).
    traces: list[str] = field(default_factory=list)


@dataclass
class UploadReport:
    """The files of one :meth:`Client.upload`, in order, and the time it took."""

    items: list[Sent]
    #: Seconds spent hashing, asking and sending; then waiting for the ingests (``wait=True``).
    seconds: float = 0.0
    wait_seconds: float = 0.0

    @property
    def sent(self) -> list[Sent]:
        """Files uploaded (not failed)."""
        return [i for i in self.items if i.sent and i.status != _FAILED]

    @property
    def present(self) -> list[Sent]:
        """Files the server had already: nothing was sent."""
        return [i for i in self.items if not i.sent and i.status != _FAILED]

    @property
    def failed(self) -> list[Sent]:
        return [i for i in self.items if i.status == _FAILED]

    @property
    def bytes_sent(self) -> int:
        return sum(i.bytes for i in self.items if i.sent)

    @property
    def ok(self) -> bool:
        """True when no file failed."""
        return not self.failed


@dataclass
class _Answer:
    status: int
    headers: http.client.HTTPMessage
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body) if self.body else None


class _Reader:
    """A file read in chunks for http.client, counting what was sent."""

    def __init__(self, file: IO[bytes], progress: Callable[[int], None] | None) -> None:
        self.file = file
        self.progress = progress
        self.sent = 0

    def read(self, size: int = -1) -> bytes:
        data = self.file.read(CHUNK if size is None or size < 0 else size)
        self.sent += len(data)
        if data and self.progress is not None:
            self.progress(len(data))
        return data


class Client:
    """A client of one tracelake server (``tracelake serve``; docs/api.md).

    Args:
        url: The server, e.g. ``https://tracelake.example.com`` (default: ``$TRACELAKE_URL``, else
            ``http://127.0.0.1:8000``).
        token: A bearer token with the scopes the calls need (default: ``$TRACELAKE_TOKEN``; none: send none).
        timeout: Seconds a socket may wait for the server to send or take anything.
        retries: How many times a request is tried again after a connection error, a 408, 429 or 5xx.
        backoff: The first wait before trying again, in seconds; it doubles each try (with jitter).
        max_delay: The longest one wait between tries.
    """

    def __init__(self, url: str | None = None, token: str | None = None, *, timeout: float = 120.0,
                 retries: int = 8, backoff: float = 0.5, max_delay: float = 30.0) -> None:
        self.url = (url or os.environ.get("TRACELAKE_URL") or DEFAULT_URL).rstrip("/")
        self.token = token if token is not None else os.environ.get("TRACELAKE_TOKEN") or None
        parts = urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ServerError(f"not a server URL: {self.url!r} (expected http://host:port or https://host)")
        self._scheme, self._host, self._port = parts.scheme, parts.hostname, parts.port
        self._prefix = parts.path.rstrip("/")
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.max_delay = max_delay
        #: Requests tried again, by cause (``connection``, ``429``, ``503``, ...): what a run cost in retries.
        self.retried: dict[str, int] = {}

    def __repr__(self) -> str:
        return f"Client({self.url!r})"

    # -- uploads ---------------------------------------------------------------------------------------

    def upload(self, paths: str | Path | Iterable[str | Path], *, job: str = "default",
               labels: Mapping[str, str] | None = None, wait: bool = False, wait_timeout: float = 600.0,
               progress: UploadProgress | None = None, ask_first: bool = True) -> UploadReport:
        """Upload trace files, and the trace files under folders, to ``job``; each file once.

        A file whose trace id the server knows (ingested, queued or ingesting) is not sent; one
        whose ingest failed is sent again. Archives (``.zip``, ``.tar.gz``) are always sent (the
        server still ingests nothing twice).

        Args:
            paths: Files and folders.
            job: The job to file the traces under.
            labels: ``key=value`` labels for the traces.
            wait: Return once every trace is ingested or failed (at most ``wait_timeout`` seconds).
            progress: Told about files and bytes as they go.
            ask_first: Compute each file's trace id and ask the server for it before sending (False: send
                at once, for a file just made that the server cannot have; it still ingests nothing twice).

        Returns:
            One :class:`Sent` per file; a file that cannot be read, or that the server refuses,
            is a ``failed`` item naming why, and the other files are uploaded regardless. A file
            found in a folder that the server recognises as no trace (a stray ``.log``) is left out.

        Raises:
            InvalidArgument: ``job`` is not a job name, or a label key is not one (nothing is sent).
            ServerError: the server cannot be reached (after the retries), or refuses the token.
        """
        check_job(job)  # refused here, before a byte is read or sent (contracts/names.py)
        labels = check_labels(labels or {})
        started = time.monotonic()
        items, seen = [], set()
        for raw in [paths] if isinstance(paths, str | Path) else paths:
            for p, named in trace_files(raw):
                if p.resolve() not in seen:  # a file named and found in a folder named too: once
                    seen.add(p.resolve())
                    items.append((p, named))
        sizes = [(p, _size(p)) for p, _ in items]
        if progress is not None:
            progress.start(sizes)
        query = [("job", job)] + ([("labels", json.dumps(dict(labels)))] if labels else [])
        report = UploadReport([])
        for (path, named), (_, size) in zip(items, sizes, strict=True):
            if progress is not None:
                progress.file_started(path)
            item = self._upload_one(path, named, size, query, progress, ask_first)
            if item is not None:
                report.items.append(item)
                if progress is not None:
                    progress.file_done(item)
        report.seconds = time.monotonic() - started
        if wait:
            self._wait(report, started + report.seconds + wait_timeout)
            report.wait_seconds = time.monotonic() - started - report.seconds
        return report

    def _upload_one(self, path: Path, named: bool, size: int, query: list[tuple[str, str]],
                    progress: UploadProgress | None, ask_first: bool) -> Sent | None:
        archive = path.name.lower().endswith(ARCHIVE_SUFFIXES)
        trace_id = None
        if not archive and ask_first:
            try:
                trace_id = content_id(path)
            except (OSError, ValueError) as exc:
                if progress is not None:
                    progress.advance(size)
                return Sent(path, None, _FAILED, False, error=str(exc) if isinstance(exc, ValueError)
                            else f"{path}: {exc.strerror or exc}")
            known = self._known(trace_id)
            if known is not None and known.get("status") != _FAILED:
                if progress is not None:
                    progress.advance(size)
                return Sent(path, trace_id, str(known["status"]), False, job=known.get("job"))
        try:
            answer = self._request("PUT", f"/api/v1/traces/{quote(path.name[-200:], safe='')}", query=query,
                                   file=path, progress=progress.advance if progress is not None else None,
                                   ok=(202,), raise_for=(401, 403))
        except OSError as exc:
            return Sent(path, trace_id, _FAILED, False, error=f"{path}: {exc.strerror or exc}")
        doc = answer.json() or {}
        if answer.status != 202:
            kind = doc.get("kind") if isinstance(doc, dict) else None
            message = doc.get("error") if isinstance(doc, dict) else None
            if not named and kind == "UnknownFormatError":
                return None  # a log or text file in the folder that is no trace: as `ingest` leaves it out
            return Sent(path, trace_id, _FAILED, True, error=message or f"HTTP {answer.status}", bytes=size)
        traces = doc.get("traces", [])
        first = traces[0] if traces else {}
        return Sent(path, trace_id or first.get("trace_id"), str(first.get("status", "queued")),
                    not first.get("already_present", False), job=first.get("job"), error=first.get("error"),
                    bytes=size, traces=[t["trace_id"] for t in traces])

    def _known(self, trace_id: str) -> dict[str, Any] | None:
        """The server's state of a trace, or None when it has none."""
        answer = self._request("GET", f"/api/v1/traces/{trace_id}", ok=(200, 404))
        return answer.json() if answer.status == 200 else None

    def _wait(self, report: UploadReport, deadline: float) -> None:
        pending = [i for i in report.items if i.status not in (_DONE, _FAILED)]
        delay = 0.1
        while pending:
            for item in list(pending):
                states = [self.status(t) for t in (item.traces or [item.trace_id or ""])]
                failed = [s for s in states if s.get("status") == _FAILED]
                if failed:
                    item.status, item.error = _FAILED, "; ".join(str(s.get("error")) for s in failed)
                elif all(s.get("status") == _DONE for s in states):
                    item.status, item.job = _DONE, states[0].get("job") or item.job
                if item.status in (_DONE, _FAILED):
                    pending.remove(item)
            if not pending:
                return
            if time.monotonic() > deadline:
                raise ServerError(f"{len(pending)} traces are still being ingested after the wait ran out "
                                  f"({', '.join(str(i.trace_id) for i in pending[:5])}); ask again with status()")
            time.sleep(delay)
            delay = min(delay * 1.5, 2.0)

    # -- reading -----------------------------------------------------------------------------------------

    def status(self, trace_id: str) -> dict[str, Any]:
        """A trace's state: ``{"trace_id", "job", "status", "error", "trace"}`` (docs/api.md).

        Raises:
            ServerError: no such trace (``status`` 404), or the server refused or could not be reached.
        """
        return dict(self._request("GET", f"/api/v1/traces/{quote(trace_id, safe='')}").json())

    def job(self, job: str, *, top: int = 8) -> dict[str, pl.DataFrame]:
        """Every analysis of a job as polars frames, by name (``breakdown``, ``findings``, ``top_kernels``, ...).

        The names are those of ``GET /api/v1/jobs/{job}`` and of ``Warehouse.analyze(job=...)``:
        the ones the API nests under ``analysis`` are at the same level here.

        Raises:
            ServerError: the job has no traces (``status`` 404), or the request failed.
        """
        import polars as pl

        doc = self._request("GET", f"/api/v1/jobs/{quote(job, safe='')}", query=[("top", str(top))]).json()
        flat = {**{k: v for k, v in doc.items() if k != "analysis"}, **doc.get("analysis", {})}
        return {name: pl.DataFrame(rows, infer_schema_length=None) for name, rows in flat.items()
                if isinstance(rows, list)}

    def sql(self, query: str, *, max_rows: int | None = None) -> pl.DataFrame:
        """Run one read-only SQL query on the server (``POST /api/v1/sql``) and return the rows as a frame.

        A truncated answer (past ``max_rows`` or the server's limits) logs a warning.

        Raises:
            ServerError: the query was refused (``status`` 400, with DuckDB's message) or the request failed.
        """
        import polars as pl

        body: dict[str, Any] = {"sql": query} | ({"max_rows": max_rows} if max_rows is not None else {})
        doc = self._request("POST", "/api/v1/sql", body=json.dumps(body).encode()).json()
        if doc.get("truncated"):
            log.warning("the answer was cut at %s rows (%s)", doc.get("row_count"), doc.get("truncated_by"))
        names = list(doc["columns"])
        schema = {name: _POLARS_TYPES.get(kind.split("(")[0]) for name, kind in zip(names, doc["types"], strict=True)}
        frame = pl.DataFrame(doc["rows"], schema=names, orient="row", infer_schema_length=None)
        casts = [pl.col(n).cast(getattr(pl, t)) for n, t in schema.items() if t is not None]
        return frame.with_columns(casts) if casts else frame

    # -- HTTP ---------------------------------------------------------------------------------------------

    def _request(self, method: str, path: str, *, query: list[tuple[str, str]] | None = None,
                 body: bytes | None = None, file: Path | None = None, progress: Callable[[int], None] | None = None,
                 ok: tuple[int, ...] = (200,), raise_for: tuple[int, ...] = ()) -> _Answer:
        """One request, tried again on connection errors, 408, 429 and 5xx.

        Answers in ``ok`` return; with ``file`` given, other 4xx answers return too (but those in
        ``raise_for``), for the caller to report per file; anything else raises :class:`ServerError`.
        """
        target = self._prefix + path + (f"?{urlencode(query)}" if query else "")
        headers = {"Accept": "application/json", "User-Agent": "tracelake-client"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        if body is not None:
            headers["Content-Type"] = "application/json"
        for attempt in range(self.retries + 1):
            reader: _Reader | None = None
            try:
                if file is not None:
                    with file.open("rb") as f:
                        headers["Content-Length"] = str(os.fstat(f.fileno()).st_size)
                        headers["Content-Type"] = "application/octet-stream"
                        reader = _Reader(f, progress)
                        answer = self._send(method, target, reader, headers)
                else:
                    answer = self._send(method, target, body, headers)
            except (ConnectionError, TimeoutError, socket.timeout, http.client.HTTPException, OSError) as exc:
                if isinstance(exc, FileNotFoundError | PermissionError | IsADirectoryError):
                    raise
                if reader is not None and progress is not None and reader.sent:
                    progress(-reader.sent)  # the file starts over
                if attempt == self.retries:
                    raise ServerError(f"cannot reach {self.url}: {exc or type(exc).__name__} "
                                      f"(tried {attempt + 1} times)") from None
                self._pause(attempt, "connection", None, f"{method} {path}: {exc or type(exc).__name__}")
                continue
            status = answer.status
            if status in ok:
                return answer
            if status in (408, 429) or status >= 500:
                if reader is not None and progress is not None and reader.sent:
                    progress(-reader.sent)
                if attempt < self.retries:
                    self._pause(attempt, str(status), answer.headers.get("Retry-After"),
                                f"{method} {path}: HTTP {status}")
                    continue
            if file is not None and 400 <= status < 500 and status not in raise_for and status not in (408, 429):
                return answer
            raise _error(answer, method, self.url + path)
        raise AssertionError("unreachable")  # the loop returns or raises

    def _send(self, method: str, target: str, body: bytes | _Reader | None, headers: dict[str, str]) -> _Answer:
        cls = http.client.HTTPSConnection if self._scheme == "https" else http.client.HTTPConnection
        conn = cls(self._host, self._port, timeout=self.timeout, blocksize=CHUNK)
        try:
            try:
                conn.request(method, target, body=body, headers=headers)
            except (BrokenPipeError, ConnectionResetError):
                # The server may have answered early (401, 413) and closed: that answer is read below if it came;
                # if none did, getresponse() raises and this try counts as a connection error.
                pass
            response = conn.getresponse()
            return _Answer(response.status, response.headers, response.read())
        finally:
            conn.close()

    def _pause(self, attempt: int, cause: str, retry_after: str | None, what: str) -> None:
        self.retried[cause] = self.retried.get(cause, 0) + 1
        delay = _retry_after(retry_after)
        if delay is None:
            delay = min(self.max_delay, self.backoff * 2**attempt) * random.uniform(0.5, 1.0)
        log.info("%s; trying again in %.1fs (%d of %d)", what, delay, attempt + 1, self.retries)
        time.sleep(delay)


#: Polars types of the DuckDB types ``POST /api/v1/sql`` names (others are inferred from the values).
_POLARS_TYPES = {"BIGINT": "Int64", "INTEGER": "Int32", "SMALLINT": "Int16", "TINYINT": "Int8", "UBIGINT": "UInt64",
                 "UINTEGER": "UInt32", "USMALLINT": "UInt16", "UTINYINT": "UInt8", "DOUBLE": "Float64",
                 "FLOAT": "Float32", "VARCHAR": "String", "BOOLEAN": "Boolean"}


def _retry_after(value: str | None) -> float | None:
    """Seconds a ``Retry-After`` header asks for (a number or an HTTP date), at most 5 minutes."""
    if not value:
        return None
    try:
        return min(max(float(value), 0.0), 300.0)
    except ValueError:
        pass
    from email.utils import parsedate_to_datetime
    try:
        return min(max(parsedate_to_datetime(value).timestamp() - time.time(), 0.0), 300.0)
    except (TypeError, ValueError):
        return None


def _error(answer: _Answer, method: str, url: str) -> ServerError:
    try:
        doc = answer.json()
    except ValueError:
        doc = None
    message = doc.get("error") if isinstance(doc, dict) else None
    if message is None and isinstance(doc, dict) and "detail" in doc:  # FastAPI's validation errors
        message = json.dumps(doc["detail"])
    if message is None:
        message = answer.body.decode(errors="replace").strip()[:500] or http.client.responses.get(answer.status, "")
    kind = doc.get("kind") if isinstance(doc, dict) else None
    return ServerError(f"{message} (HTTP {answer.status} from {method} {url})", status=answer.status, kind=kind)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0
