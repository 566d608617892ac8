"""The spool: traces the background uploader could not send, kept on disk until ``tracelake push --spool`` sends them.

One folder per trace handed over, so two runs' ``rank-0.12.pt.trace.json.gz`` never meet::

    <spool>/<entry>/rank-0.12.pt.trace.json.gz   the trace, under the name the server is to see
    <spool>/<entry>/tracelake.json               {"job": ..., "labels": {...}, "files": [...], "created": ...}

The sidecar is written last (a rename), so an entry without one is still being written, or was cut
off by a crash, and is left alone. :func:`send_spool` removes each file only once the server has
confirmed it (accepted it, or had it already), and an entry's folder once it is empty. The layout
and the default place are in docs/integrations/pytorch.md ("When the server is down").
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import shutil
import socket
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from .core import Client, UploadReport

__all__ = ["SIDECAR", "SpoolEntry", "SpoolReport", "add_to_spool", "default_spool", "send_spool", "spool_entries"]

log = logging.getLogger(__name__)

#: The sidecar of an entry: its job, labels and files.
SIDECAR = "tracelake.json"
#: Bytes copied per step when a file is gzipped into the spool.
_BLOCK = 1 << 20


def default_spool() -> Path:
    """The spool folder: ``$TRACELAKE_SPOOL``, else ``$XDG_CACHE_HOME/tracelake/spool`` (``~/.cache/tracelake/spool``)."""
    named = os.environ.get("TRACELAKE_SPOOL")
    if named:
        return Path(named).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "tracelake" / "spool"


@dataclass
class SpoolEntry:
    """One complete entry of a spool: the files of one hand-over and what to file them under."""

    folder: Path
    job: str
    labels: dict[str, str]
    files: list[Path]


@dataclass
class SpoolReport:
    """What :func:`send_spool` did: the entries sent (and removed), those that failed, those left alone."""

    spool: Path
    sent: list[Path] = field(default_factory=list)
    failed: list[tuple[Path, str]] = field(default_factory=list)
    #: Entries without a sidecar (being written, or cut off by a crash): not touched.
    incomplete: list[Path] = field(default_factory=list)
    uploads: list[UploadReport] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when every complete entry was sent."""
        return not self.failed


def gzip_file(source: Path, target: Path) -> None:
    """Write ``source`` gzipped to ``target`` (level 3: a trace shrinks some 10x, at well over 100 MB/s)."""
    with source.open("rb") as raw, gzip.open(target, "wb", compresslevel=3) as out:
        shutil.copyfileobj(raw, out, _BLOCK)


def add_to_spool(spool: Path, source: Path, *, job: str, labels: dict[str, str], name: str | None = None,
                 compress: bool = False, move: bool = False) -> Path:
    """Keep ``source`` in ``spool`` as a new entry, with its job and labels; return the entry's folder.

    Args:
        spool: The spool folder (made if missing).
        source: The trace file.
        name: The name the server is to see (default: the source's).
        compress: Gzip the file on the way in (``name`` is then the gzip's name).
        move: Take the file away from ``source`` (else copy it: the user's own profile files stay where they are).

    Raises:
        OSError: the spool cannot be written.
    """
    spool.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    entry = Path(tempfile.mkdtemp(prefix=f"{stamp}-{socket.gethostname()}-{os.getpid()}-", dir=spool))
    target = entry / (name or source.name)
    if compress:
        gzip_file(source, target)
        if move:
            source.unlink()
    elif move:
        shutil.move(source, target)
    else:
        shutil.copyfile(source, target)
    _write_sidecar(entry, job, labels, [target.name])
    return entry


def _write_sidecar(entry: Path, job: str, labels: dict[str, str], files: list[str]) -> None:
    doc = {"job": job, "labels": labels, "files": files, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    partial = entry / f".{SIDECAR}.partial"
    partial.write_text(json.dumps(doc, indent=1) + "\n")
    os.replace(partial, entry / SIDECAR)


def spool_entries(spool: Path) -> tuple[list[SpoolEntry], list[Path], list[tuple[Path, str]]]:
    """The entries of ``spool``, oldest first: the complete ones, those without a sidecar yet, the damaged ones (and why)."""
    complete: list[SpoolEntry] = []
    incomplete: list[Path] = []
    damaged: list[tuple[Path, str]] = []
    if not spool.is_dir():
        return complete, incomplete, damaged
    for folder in sorted(p for p in spool.iterdir() if p.is_dir() and not p.name.startswith(".")):
        sidecar = folder / SIDECAR
        if not sidecar.is_file():
            incomplete.append(folder)
            continue
        try:
            doc = json.loads(sidecar.read_text())
            job, labels, files = str(doc["job"]), dict(doc.get("labels") or {}), [str(f) for f in doc["files"]]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            damaged.append((folder, f"its {SIDECAR} is not a spool sidecar ({exc}); fix it or move the folder out "
                                    "of the spool"))
            continue
        complete.append(SpoolEntry(folder, job, {str(k): str(v) for k, v in labels.items()},
                                   [folder / f for f in files if "/" not in f and f not in ("", ".", "..")]))
    return complete, incomplete, damaged


def send_spool(client: Client, spool: str | Path | None = None, *, wait: bool = False,
               wait_timeout: float = 600.0) -> SpoolReport:
    """Upload every complete entry of ``spool`` under its own job and labels, removing each file the server confirms.

    A file is confirmed when the server accepted it or had it already (with ``wait``: once it is
    ingested). An entry whose files are all confirmed is removed; one with a failed file keeps it
    (and says why in the report), so nothing is lost to a server that refused it for now.

    Raises:
        ServerError: the server cannot be reached (after the client's retries) or refuses the token;
            the entries not sent by then stay in the spool.
    """
    folder = Path(spool).expanduser() if spool is not None else default_spool()
    entries, incomplete, damaged = spool_entries(folder)
    report = SpoolReport(folder, incomplete=incomplete, failed=list(damaged))
    for entry in entries:
        present = [f for f in entry.files if f.is_file()]
        upload = client.upload(present, job=entry.job, labels=entry.labels, wait=wait,
                               wait_timeout=wait_timeout) if present else UploadReport([])
        report.uploads.append(upload)
        confirmed = {item.path for item in upload.items if item.status != "failed"}
        for path in confirmed:
            path.unlink(missing_ok=True)
        left = [f for f in present if f not in confirmed]
        if left:
            errors = "; ".join(str(i.error) for i in upload.failed) or "not confirmed by the server"
            report.failed.append((entry.folder, errors))
            _write_sidecar(entry.folder, entry.job, entry.labels, [f.name for f in left])
        else:
            shutil.rmtree(entry.folder, ignore_errors=True)
            report.sent.append(entry.folder)
            log.debug("spool entry %s sent and removed", entry.folder)
    return report
