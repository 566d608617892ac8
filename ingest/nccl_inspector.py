"""NCCL Inspector plugin output (NCCL >= 2.28): JSON lines, one completed operation each, into ``collectives``.

A record (docs/formats.md, section 3) is ``{"header": {id, comm_name, rank, n_ranks, nnodes},
"metadata": {inspector_output_format_version, dump_timestamp_us, hostname, pid, ...},
"coll_perf": {coll, coll_sn, coll_msg_size_bytes, coll_exec_time_us, ...}}`` or the same
with ``p2p_perf`` (``p2p``, ``p2p_sn``, ``p2p_peer``, ...). A record is one line (the
plugin's own JSON lines) or pretty-printed over several (``jq .`` or a re-dump with an
indent): :func:`_records` yields each top-level ``{...}`` object with the line it starts
on, holding at most one record in memory. Lines outside a record that do not open one
(launcher noise) and records that are not Inspector records are skipped and counted (a
warning says how many); a file with none is an error, and so are a record still open at
the end of the file, one longer than ``MAX_RECORD_BYTES`` and a multi-line one that is not
JSON (an unbalanced brace would swallow the records after it): all name its first line.

Mapping: ``collective`` in snake case (``AllReduce`` -> ``all_reduce``), ``process_group``
the communicator name (else its id), ``seq`` = ``coll_sn`` (the same on every rank of
the communicator), ``message_bytes`` as nccl-tests counts the operation (the record's
per-rank size, times the ranks for AllGather, ReduceScatter and AlltoAll). Inspector
gives no start time: ``ts_ns`` is the dump time minus the execution time (an
estimate; the dump follows completion closely).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import msgspec

from tracelake.contracts.errors import TraceFormatError

from .model import ParseOptions, TraceInfo
from .nccl_ops import collective_name, nccl_tests_bytes
from .source import iter_chunks
from .tables import fit_int, write_table

FORMAT = "nccl_inspector"

#: One record larger than this is not an Inspector record (they are a few hundred bytes, a few KiB in
#: verbose mode): stop rather than hold an unbounded buffer.
MAX_RECORD_BYTES = 16 << 20

_COLUMNS = ("event_id", "rank", "collective", "process_group", "group_size", "seq", "message_bytes", "src_rank",
            "dst_rank", "ts_ns", "dur_ns", "cpu_ts_ns", "cpu_dur_ns", "is_async", "source")


def sniff(head: bytes, filename: str) -> bool:
    """JSON lines whose first record has an Inspector ``header`` and a ``coll_perf``/``p2p_perf``."""
    lines = head.split(b"\n")
    for number, line in enumerate(lines[:20]):  # launcher noise may come first
        line = line.strip()
        if not line.startswith(b"{"):
            continue
        # a JSON line holds the whole record; a pretty-printed one spreads it over the next lines
        record = line if b'"header"' in line else b"\n".join(lines[number:number + 40])
        if b'"header"' in record and (b'"coll_perf"' in record or b'"p2p_perf"' in record
                                      or b"inspector_output_format_version" in record):
            return True
    return False


def _int(value: object, bits: int = 64) -> int | None:
    return fit_int(value, bits)


def _ns(us: float | None) -> int | None:
    """Microseconds as integer nanoseconds; None where they do not fit 64 bits."""
    if us is None:
        return None
    ns = us * 1000
    return fit_int(round(ns)) if math.isfinite(ns) else None


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def parse(source: Path, staging: Path, options: ParseOptions) -> TraceInfo:
    """Parse Inspector JSON lines into ``collectives``.

    Raises:
        TraceFormatError: no Inspector record in the file.
    """
    decoder = msgspec.json.Decoder()
    rows: dict[str, list[object]] = {c: [] for c in _COLUMNS}
    skipped = lines = 0
    facts: dict[str, Any] = {}
    chunks = iter_chunks(source, on_bytes=options.on_bytes, name=options.source_name)
    cut: list[int] = []  # the line a record cut off by the file's end starts on
    for start, raw in _records(chunks, options.source_name, cut):
        if raw[:1] == b"{" and b"\n" in raw:  # pretty-printed: a broken one would hide the records it swallowed
            try:
                decoder.decode(raw)
            except (msgspec.DecodeError, RecursionError) as exc:
                raise TraceFormatError(options.source_name, f"a record spanning lines is not valid JSON ({exc})",
                                       where=f"line {start}") from None
        lines, skipped = _line(raw, decoder, rows, facts, lines, skipped)
    if cut and not rows["seq"]:
        raise TraceFormatError(options.source_name, "a record is never closed (file truncated, or a missing '}')",
                               where=f"line {cut[0]}")
    if not rows["seq"]:
        raise TraceFormatError(options.source_name, f"no NCCL Inspector records in {lines} non-empty lines or records")
    rows["event_id"] = list(range(len(rows["seq"])))
    write_table(staging, "collectives", rows, trace_id=options.trace_id)
    info = TraceInfo(format=FORMAT, event_count=len(rows["seq"]), uncompressed_bytes=source.stat().st_size)
    ranks = sorted({r for r in rows["rank"] if isinstance(r, int)})
    info.rank = ranks[0] if ranks else 0
    info.rank_source = "Inspector header"
    info.world_size = facts.get("n_ranks")
    info.host, info.pid = facts.get("hostname"), facts.get("pid")
    starts = [t for t in rows["ts_ns"] if isinstance(t, int)]
    ends = [t + d for t, d in zip(rows["ts_ns"], rows["dur_ns"], strict=True)
            if isinstance(t, int) and isinstance(d, int)]
    info.start_ns, info.end_ns = (min(starts), max(ends)) if starts and ends else (None, None)
    if skipped:
        info.warnings.append(f"{skipped} of {lines} lines or records were not Inspector records and were skipped")
    if cut:  # the plugin appends as the job runs: a job that was killed leaves its last record half written
        info.warnings.append(f"the last record (from line {cut[0]}) is cut off by the end of the file (written when "
                             f"the job stopped?) and was left out; the {len(rows['seq'])} whole records before it "
                             "were read")
    return info


def _records(chunks: Iterable[bytes], name: str, cut: list[int]) -> Iterator[tuple[int, bytes]]:
    """Each top-level JSON object in ``chunks`` (one line or several), and each other non-empty line,
    with the line it starts on.

    Scans braces outside strings, so a record may span lines and chunks; only the record being
    read is held in memory. A record still open at the end of the file is not yielded: the line
    it starts on is appended to ``cut`` (docs/formats.md, "NCCL Inspector": a killed job's last record).

    Raises:
        TraceFormatError: a record grows past ``MAX_RECORD_BYTES``; the error names the line the
            record starts on.
    """
    record = bytearray()
    depth, in_string, escaped, line, start_line = 0, False, False, 1, 0
    noise = bytearray()
    for chunk in chunks:
        index = 0
        while index < len(chunk):
            if depth == 0:
                # between records: a line that does not open one (after blanks) is noise
                newline = chunk.find(b"\n", index)
                end = len(chunk) if newline < 0 else newline
                segment = chunk[index:end]
                if not noise.strip() and newline >= 0 and segment.lstrip()[:1] == b"{" and \
                        segment.rstrip()[-1:] == b"}" and segment.count(b"{") == segment.count(b"}"):
                    yield line, segment.strip()  # a JSON line (the plugin's own shape): no byte scan
                    line, index = line + 1, newline + 1
                    continue
                if not noise.strip() and segment.lstrip()[:1] == b"{":
                    noise.clear()
                    index += len(segment) - len(segment.lstrip())
                    start_line, depth = line, 0
                    record.clear()
                    index = _scan_into(record, chunk, index, state := [0, False, False])
                    depth, in_string, escaped = state[0], bool(state[1]), bool(state[2])
                    line += record.count(b"\n")
                    if depth == 0:
                        yield start_line, bytes(record)
                        record.clear()
                    continue
                noise += segment
                if len(noise) > MAX_RECORD_BYTES:
                    raise TraceFormatError(name, "a line longer than 16 MiB (not Inspector output)",
                                           where=f"line {line}")
                if newline < 0:
                    break
                if noise.strip():
                    yield line, bytes(noise)
                noise.clear()
                line += 1
                index = newline + 1
            else:
                state = [depth, in_string, escaped]
                before = len(record)
                index = _scan_into(record, chunk, index, state)
                depth, in_string, escaped = state[0], bool(state[1]), bool(state[2])
                line += record.count(b"\n", before)
                if depth == 0:
                    yield start_line, bytes(record)
                    record.clear()
            if len(record) > MAX_RECORD_BYTES:
                raise TraceFormatError(name, f"a record longer than {MAX_RECORD_BYTES >> 20} MiB "
                                       "(not Inspector output, or a missing closing brace)",
                                       where=f"line {start_line}")
    if depth:
        if b"\n{" in record:  # it swallowed the records after it: a brace is missing, not the file's end
            raise TraceFormatError(name, "a record is never closed (a missing '}')", where=f"line {start_line}")
        cut.append(start_line)
    if noise.strip():
        yield line, bytes(noise)


def _scan_into(record: bytearray, chunk: bytes, index: int, state: list[Any]) -> int:
    """Copy ``chunk[index:]`` into ``record`` up to the brace closing the object; return where it stopped.

    ``state`` is ``[depth, in_string, escaped]``, read and updated in place across chunks. Jumps
    from one quote, backslash or brace to the next, so long strings cost no Python steps.
    """
    depth, in_string, escaped = state
    start = index
    while index < len(chunk) and index - start + len(record) <= MAX_RECORD_BYTES:
        if escaped:
            escaped, index = False, index + 1
            continue
        found = (_IN_STRING if in_string else _STRUCTURE).search(chunk, index)
        if found is None:
            index = len(chunk)
            break
        byte, index = chunk[found.start()], found.start() + 1
        if byte == 0x5C:  # backslash, inside a string
            escaped = True
        elif byte == 0x22:  # quote
            in_string = not in_string
        elif byte == 0x7B:  # {
            depth += 1
        else:  # }
            depth -= 1
            if depth == 0:
                break
    record += chunk[start:index]
    state[:] = [depth, in_string, escaped]
    return index


_IN_STRING = re.compile(rb'["\\]')
_STRUCTURE = re.compile(rb'["{}]')


def _line(raw: bytes, decoder: msgspec.json.Decoder[Any], rows: dict[str, list[object]], facts: dict[str, Any],
          lines: int, skipped: int) -> tuple[int, int]:
    text = raw.strip()
    if not text:
        return lines, skipped
    lines += 1
    try:
        record = decoder.decode(text)
    except (msgspec.DecodeError, RecursionError):  # RecursionError: nested too deeply
        return lines, skipped + 1
    if not isinstance(record, dict) or not isinstance(record.get("header"), dict):
        return lines, skipped + 1
    header = record["header"]
    meta: dict[str, Any] = record["metadata"] if isinstance(record.get("metadata"), dict) else {}
    coll, p2p = record.get("coll_perf"), record.get("p2p_perf")
    perf = coll if isinstance(coll, dict) else p2p if isinstance(p2p, dict) else None
    if perf is None:
        return lines, skipped + 1
    is_p2p = perf is p2p
    name = perf.get("p2p" if is_p2p else "coll")
    seq = _int(perf.get("p2p_sn" if is_p2p else "coll_sn"))
    exec_us = _number(perf.get("p2p_exec_time_us" if is_p2p else "coll_exec_time_us"))
    if not isinstance(name, str) or seq is None or exec_us is None:
        return lines, skipped + 1
    rank, n_ranks = _int(header.get("rank"), 32), _int(header.get("n_ranks"), 32)
    collective = collective_name(name)
    size = _int(nccl_tests_bytes(collective, _int(perf.get("p2p_msg_size_bytes" if is_p2p else "coll_msg_size_bytes")),
                                 n_ranks))
    dump_int, dump_float = _int(meta.get("dump_timestamp_us")), _number(meta.get("dump_timestamp_us"))
    dump_ns = _int(dump_int * 1000) if dump_int is not None else _ns(dump_float)
    dur_ns = _ns(exec_us)
    ts_ns = _int(dump_ns - dur_ns) if dump_ns is not None and dur_ns is not None else None
    peer = _int(perf.get("p2p_peer"), 32) if is_p2p else None
    comm = header.get("comm_name") or header.get("id")
    if is_p2p and comm is not None:
        comm = f"{comm}:p2p"  # p2p_sn counts separately from coll_sn
    for column, value in (
        ("rank", rank), ("collective", collective), ("process_group", str(comm) if comm is not None else None),
        ("group_size", n_ranks), ("seq", seq), ("message_bytes", size),
        ("src_rank", rank if is_p2p and collective == "send" else peer if is_p2p else None),
        ("dst_rank", peer if is_p2p and collective == "send" else rank if is_p2p else None),
        ("ts_ns", ts_ns), ("dur_ns", dur_ns), ("cpu_ts_ns", None), ("cpu_dur_ns", None), ("is_async", False),
        ("source", "nccl_inspector"),
    ):
        rows[column].append(value)
    facts.setdefault("hostname", meta.get("hostname") if isinstance(meta.get("hostname"), str) else None)
    facts.setdefault("pid", _int(meta.get("pid")))
    if n_ranks:
        facts["n_ranks"] = max(facts.get("n_ranks") or 0, n_ranks)
    return lines, skipped
