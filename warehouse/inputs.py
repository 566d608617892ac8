"""Which files an ingest reads: the paths named, and the trace files found under folders."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from tracelake import ingest
from tracelake.contracts.errors import TracelakeError
from tracelake.contracts.files import RECOGNISED_SUFFIXES as _RECOGNISED_SUFFIXES
from tracelake.contracts.files import TRACE_SUFFIXES
from tracelake.contracts.files import XLA_RENDERING as _XLA_JSON



def expand_inputs(paths: Iterable[str | Path]) -> list[Path]:
    """Files named directly, plus trace files found under directories, sorted and de-duplicated.

    A path that does not exist is kept, so that ingest reports it as a failure.
    """
    out: list[Path] = []
    seen: set[Path] = set()
    for raw in paths:
        path = Path(raw)
        found = _traces_in(path) if path.is_dir() else [path]
        for p in found:
            key = p.resolve()
            if key not in seen:
                seen.add(key)
                out.append(p)
    return out


def _traces_in(folder: Path) -> list[Path]:
    """Trace files under ``folder``; XLA's JSON renderings are left out where their ``.xplane.pb`` is there."""
    found = sorted(p for p in folder.rglob("*") if p.is_file() and _looks_like_trace(p))
    xspaces: dict[Path, set[str]] = {p.parent: set() for p in found if p.name.endswith((".xplane.pb", ".xplane.pb.gz"))}
    for p in found:
        if p.parent in xspaces:
            xspaces[p.parent].add(p.name.split(".xplane.pb")[0])
    kept = []
    for p in found:
        match = _XLA_JSON.match(p.name)
        if match and p.parent in xspaces and (match.group("host") is None or match.group("host") in xspaces[p.parent]):
            continue
        kept.append(p)
    return kept




def _looks_like_trace(path: Path) -> bool:
    if path.name.startswith("."):
        return False
    if path.name.endswith(_RECOGNISED_SUFFIXES) or ("." not in path.name and "rank" in path.name.lower()):
        # text outputs, pickles, and Flight Recorder dumps (``nccl_trace_rank_3``): only when recognised
        try:
            ingest.detect(path)
        except TracelakeError:
            return False
        return True
    return path.name.endswith(TRACE_SUFFIXES)


def file_size(path: Path) -> int:
    """The size of a file in bytes; 0 when it cannot be read (it is reported when ingested)."""
    try:
        return path.stat().st_size
    except OSError:
        return 0
