"""What the client sends: the trace files under a path, and each file's trace id, computed as the server does.

Standard library only (ISA-L when it is there), like the rest of :mod:`tracelake.client`. The id rule is in
docs/formats.md ("Trace ids"); which files a folder holds follows ``warehouse/inputs.py``, and
tests/test_client.py holds both equal to the server's.
"""

from __future__ import annotations

import hashlib
import zlib
from pathlib import Path
from typing import Any

from tracelake.contracts.files import RECOGNISED_SUFFIXES, TRACE_SUFFIXES
from tracelake.contracts.files import XLA_RENDERING as _XLA_JSON

#: Hex digits of a trace id (``tracelake.ingest.ID_DIGITS``).
ID_DIGITS = 20
#: Bytes read from disk and sent per step.
CHUNK = 1 << 20
_GZIP_MAGIC = b"\x1f\x8b"
#: Archives: the server gives one trace id per member, unknown here, so they are always sent.
ARCHIVE_SUFFIXES = (".zip", ".tar.gz", ".tgz")


def _decompressor() -> Any:
    try:
        from isal import isal_zlib  # the server's inflater: some 3x faster than zlib where it is installed
        return isal_zlib.decompressobj(wbits=31)
    except ImportError:
        return zlib.decompressobj(wbits=31)


def content_id(path: str | Path) -> str:
    """A file's trace id as the server computes it: the first 20 hex digits of the SHA-256 of its decoded content.

    A gzip file is hashed as what it decompresses to, every member of it (zero padding between
    members tolerated), in one streaming pass.

    Raises:
        OSError: the file cannot be read.
        ValueError: its gzip stream is damaged or ends early.
    """
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        head = f.read(len(_GZIP_MAGIC))
        if not head.startswith(_GZIP_MAGIC):
            digest.update(head)
            while block := f.read(8 * CHUNK):
                digest.update(block)
            return digest.hexdigest()[:ID_DIGITS]
        pending, d, at = head, None, 0
        while True:
            if d is None:
                pending = pending.lstrip(b"\0") if at else pending
                if len(pending) < len(_GZIP_MAGIC):
                    more = f.read(CHUNK)
                    if not more:
                        if pending:
                            raise ValueError(f"{path}: gzip stream ends early (truncated?)")
                        return digest.hexdigest()[:ID_DIGITS]
                    pending += more
                    continue
                if not pending.startswith(_GZIP_MAGIC):
                    raise ValueError(f"{path}: data that is not gzip after the compressed stream")
                d, at = _decompressor(), at + 1
            out = d.decompress(pending, 4 * CHUNK)
            digest.update(out)
            pending = d.unconsumed_tail
            if d.eof:
                pending, d = d.unused_data + pending, None
            elif not pending:
                more = f.read(CHUNK)
                if not more:
                    raise ValueError(f"{path}: gzip stream ends early (truncated?)")
                pending = more


def trace_files(path: str | Path) -> list[tuple[Path, bool]]:
    """The files an upload of ``path`` sends, each with whether it was named (not found in a folder).

    A folder gives what ``tracelake ingest`` would take from it: the trace file endings, and text
    outputs, pickles and rank dumps (NCCL logs, Flight Recorder) for the server to recognise; XLA's
    JSON renderings are left out beside their ``.xplane.pb``.
    """
    folder = Path(path)
    if not folder.is_dir():
        return [(folder, True)]
    found = sorted(p for p in folder.rglob("*") if p.is_file() and not p.name.startswith(".") and (
        p.name.endswith(TRACE_SUFFIXES + RECOGNISED_SUFFIXES) or ("." not in p.name and "rank" in p.name.lower())))
    hosts: dict[Path, set[str]] = {}
    for p in found:
        if p.name.endswith((".xplane.pb", ".xplane.pb.gz")):
            hosts.setdefault(p.parent, set()).add(p.name.split(".xplane.pb")[0])
    kept = []
    for p in found:
        match = _XLA_JSON.match(p.name)
        if match and p.parent in hosts and (match.group("host") is None or match.group("host") in hosts[p.parent]):
            continue
        kept.append((p, False))
    return kept
