"""The PyTorch profiler's raw memory timeline export into ``memory_timeline``.

``torch.profiler.profile.export_memory_timeline(path)`` with ``path`` ending ``raw.json.gz``
writes one device's memory events as a gzipped JSON array of rows ``[time, action, bytes,
category]`` (docs/formats.md, "PyTorch memory timeline export"): ``time`` in ns since the
epoch (``-1`` for memory that existed before profiling began), ``action`` and ``category``
as the indexes PyTorch's ``torch/profiler/_memory_profiler.py`` gives them (:data:`ACTIONS`,
:data:`CATEGORIES`), ``bytes`` signed (a destroy, and the old version of an in-place update,
give memory back).

The export says nothing of rank or device: the rank comes from the file name
(``rank-3``, ``rank_3``), else 0 with a warning; the device is left null.

The array is read in chunks: every ``]`` but the document's last closes a row (rows hold
four numbers, no strings or nesting), so each chunk is cut after its last ``]`` and decoded
as rows, and memory stays flat however long the export.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import msgspec

from tracelake.contracts.errors import TraceFormatError

from .model import ParseOptions, TraceInfo
from .source import iter_chunks
from .tables import TableWriter, fit_int

FORMAT = "memory_timeline"

#: ``Action`` of ``torch/profiler/_memory_profiler.py``: the export writes ``action.value`` (``enum.auto()``, from 1).
ACTIONS = {1: "preexisting", 2: "create", 3: "increment_version", 4: "destroy"}
#: The export's category index: the order of ``_CATEGORY_TO_COLORS`` there; 7 is ``None`` (no category known).
CATEGORIES: dict[int, str | None] = {0: "parameter", 1: "optimizer_state", 2: "input", 3: "temporary", 4: "activation",
                                     5: "gradient", 6: "autograd_detail", 7: None}
#: Bytes without a ``]`` after which the content is not rows (a row is a few dozen bytes).
MAX_ROW_BYTES = 16 << 20
#: The time of memory that existed before the profiler started.
PREEXISTING_TIME = -1

#: A rank in a file name: ``rank-3``, ``rank_3``, ``rank3``, not ``rank30x`` within a word.
RANK_IN_NAME = re.compile(r"(?:^|[^a-z])rank[-_]?(\d+)(?:[^0-9]|$)", re.IGNORECASE)
#: The start of a raw export: two rows of four integers, or one and the end (the coalesced export
#: ``export_memory_timeline`` writes without ``raw`` starts with a list of times instead).
_ROW = rb"\[\s*-?\d+\s*,\s*-?\d+\s*,\s*-?\d+\s*,\s*-?\d+\s*\]"
_HEAD = re.compile(rb"\A\s*\[\s*" + _ROW + rb"\s*(?:,\s*" + _ROW + rb"|\])")
_PATH = re.compile(r"at `\$\[(\d+)\](.*)`")
_BYTE = re.compile(r"\(byte (\d+)\)")

_COLUMNS = ("event_id", "rank", "ts_ns", "action", "bytes", "category")


def sniff(head: bytes, filename: str) -> bool:
    """A JSON array whose first rows are four integers each."""
    return _HEAD.match(head) is not None


def rank_from_name(name: str, info: TraceInfo, what: str) -> int:
    """The rank a file name gives (``rank-3``), recorded in ``info``; else 0 and a warning naming ``what``."""
    match = RANK_IN_NAME.search(name)
    rank = fit_int(int(match.group(1)), 32) if match else None
    if rank is None:
        info.warnings.append(f"{what} holds no rank and the file name gives none (e.g. rank-3); assumed rank 0")
        return 0
    info.rank_source = "file name"
    return rank


def _pieces(source: Path, options: ParseOptions) -> Iterator[tuple[int, bytes]]:
    """Each run of whole rows (``[a,b,c,d], [a,b,c,d]``, maybe led by a comma) with the byte it starts at.

    Raises:
        TraceFormatError: the content is not one JSON array, or does not end with its closing ``]``.
    """
    name = options.source_name
    pending, offset, started, yielded = b"", 0, False, False
    for chunk in iter_chunks(source, on_bytes=options.on_bytes, name=name):
        pending += chunk
        if not started:
            stripped = pending.lstrip()
            if not stripped:
                offset, pending = offset + len(pending), b""
                continue
            if stripped[:1] != b"[":
                raise TraceFormatError(name, "not a JSON array of [time, action, bytes, category] rows",
                                       where="byte 0")
            offset += len(pending) - len(stripped) + 1
            pending, started = stripped[1:], True
        cut = pending.rfind(b"]")
        if cut < 0:
            if len(pending) > MAX_ROW_BYTES:  # rows are a few dozen bytes: stop before junk fills memory
                raise TraceFormatError(name, f"no ']' in {MAX_ROW_BYTES >> 20} MiB: not a memory timeline",
                                       where=f"byte {offset}")
            continue
        yield offset, pending[:cut + 1]
        yielded = True
        offset += cut + 1
        pending = pending[cut + 1:]
    tail = pending.strip()
    if not started:
        raise TraceFormatError(name, "holds only whitespace, not a memory timeline", where="byte 0")
    if not yielded:
        raise TraceFormatError(name, "the JSON array is never closed (truncated file?)", where=f"byte {offset}")
    # the last piece took the array's closing bracket as a row's: whatever follows must be nothing
    if tail:
        raise TraceFormatError(name, f"unexpected {tail[:20]!r} after the last row (truncated or not one JSON array)",
                               where=f"byte {offset}")


def _decode(piece: bytes, offset: int, first_row: int, decoder: msgspec.json.Decoder[list[tuple[int, int, int, int]]],
            name: str, *, first: bool, last: bool) -> list[tuple[int, int, int, int]]:
    """The rows of ``piece``; ``first``: the array's first piece (no comma before it); ``last``: it holds the
    array's closing bracket."""
    body = piece.lstrip()
    lead = len(piece) - len(body)
    if not first and body[:1] == b",":
        body, lead = body[1:], lead + 1
    elif not first and body[:1] != b"]":  # rows on both sides of a chunk's edge still need their comma
        raise TraceFormatError(name, "expected ',' between rows", where=f"byte {offset + lead}")
    text = b"[" + body if last else b"[" + body + b"]"
    try:
        return decoder.decode(text)
    except msgspec.ValidationError as exc:
        path = _PATH.search(str(exc))
        row = first_row + int(path.group(1)) if path else first_row
        message = str(exc).split(" - at ")[0]
        raise TraceFormatError(name, f"a row is not [time, action, bytes, category] of four integers ({message})",
                               where=f"row {row}{path.group(2) if path else ''}") from None
    except msgspec.DecodeError as exc:
        at = _BYTE.search(str(exc))
        byte = offset + lead + int(at.group(1)) - 1 if at else offset
        reason = str(exc).split(" (byte")[0]
        hint = " (truncated file?)" if "truncated" in reason else ""
        raise TraceFormatError(name, f"invalid JSON ({reason}){hint}", where=f"byte {byte}") from None


def parse(source: Path, staging: Path, options: ParseOptions) -> TraceInfo:
    """Parse a raw memory timeline export into ``memory_timeline``.

    Raises:
        TraceFormatError: not a JSON array of four-integer rows, a damaged or truncated file, or an
            action or category code PyTorch does not write (the error names the row).
    """
    name = options.source_name
    info = TraceInfo(format=FORMAT, uncompressed_bytes=0)
    rank = rank_from_name(name, info, "a memory timeline export")
    info.rank = rank
    decoder = msgspec.json.Decoder(list[tuple[int, int, int, int]])
    count, first, last_ts, size = 0, None, None, 0
    with TableWriter(staging, "memory_timeline", trace_id=options.trace_id) as writer:
        pieces = _pieces(source, options)
        held = next(pieces, None)
        start = held[0] if held else 0
        while held is not None:
            following = next(pieces, None)
            offset, piece = held
            size = offset + len(piece)
            rows = _decode(piece, offset, count, decoder, name, first=offset == start, last=following is None)
            columns: dict[str, list[object]] = {c: [] for c in _COLUMNS}
            for index, (ts, action, nbytes, category) in enumerate(rows, start=count):
                if action not in ACTIONS:
                    raise TraceFormatError(name, f"unknown action code {action} (PyTorch writes 1 preexisting, "
                                           "2 create, 3 increment_version, 4 destroy)", where=f"row {index}[1]")
                if category not in CATEGORIES:
                    raise TraceFormatError(name, f"unknown category code {category} (PyTorch writes 0 to 7)",
                                           where=f"row {index}[3]")
                if ts != PREEXISTING_TIME and fit_int(ts) is None or ts < PREEXISTING_TIME:
                    raise TraceFormatError(name, f"time {ts} is neither ns since the epoch nor -1 (pre-existing)",
                                           where=f"row {index}[0]")
                if fit_int(nbytes) is None:
                    raise TraceFormatError(name, f"byte count {nbytes} does not fit 64 bits", where=f"row {index}[2]")
                stamp = None if ts == PREEXISTING_TIME else ts
                if stamp is not None:
                    first = stamp if first is None else min(first, stamp)
                    last_ts = stamp if last_ts is None else max(last_ts, stamp)
                for column, value in zip(_COLUMNS, (index, rank, stamp, ACTIONS[action], nbytes, CATEGORIES[category]),
                                         strict=True):
                    columns[column].append(value)
            count += len(rows)
            writer.write(columns)
            held = following
    info.event_count = count
    info.uncompressed_bytes = size
    info.start_ns, info.end_ns = first, last_ts
    if not count:
        info.warnings.append("the memory timeline export holds no rows")
    return info
