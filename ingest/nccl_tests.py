"""nccl-tests results: the stdout of ``*_perf`` binaries, and their ``-J`` JSON, into ``nccl_benchmarks``.

Stdout layout (docs/formats.md, section 3): a ``# nThread ...`` header, ``#  Rank  N ...``
lines naming the devices, then one row per message size: ``size count type [redop]
[root]`` followed by out-of-place and in-place ``time algbw busbw #wrong``. Older
builds lack the root or redop column and print ``error``; ``N/A`` means validation
was off. Launcher prefixes (``[1,0]<stdout>:``, ``host: ``) are stripped. Each size
gives two rows (out-of-place, in-place).

The collective comes from ``# Collective test starting: all_reduce_perf``, else
the file name (``all_reduce_perf.txt``), else the JSON's ``collective``, else busbw/algbw
against the bus-bandwidth factors (:func:`.nccl_tests_facts.infer_collective`). Rank lines
with or without ``Group`` (older builds) give ranks, nodes and a ``devices`` row each; a table
pasted without the ``# nThread`` header is found by its column header; ``NCCL INFO``/``WARN``
lines in the same stream (``NCCL_DEBUG=INFO``) go to the debug-log parser, into the same trace.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from tracelake.warehouse.errors import TraceFormatError

from .model import ParseOptions, TraceInfo
from .nccl_tests_facts import (
    infer_collective,
    int_field,
    json_ranks,
    read_mixed_log,
    write_devices,
)
from .source import iter_chunks, read_head, read_whole
from .tables import fit_int, fit_text, write_table

FORMAT = "nccl_tests"

_PREFIX = re.compile(r"^(?:\[\d+,\d+\]<std(?:out|err)>:|[A-Za-z0-9_.-]+: (?=#|\s*\d))")
_HEADER = re.compile(r"#\s*nThread\s+\d+\s+nGpus\s+\d+")
_COLUMN_HEAD = re.compile(r"#\s+size\s+count\s+type\b")  # a table pasted without the nThread header
_NCCL_LOG_LINE = re.compile(r"\bNCCL (?:INFO|WARN)\b")  # NCCL_DEBUG=INFO lines mixed into the stdout
_RANK = re.compile(r"#\s+Rank\s+(\d+)\s+(?:Group\s+\d+\s+)?Pid\s+(\d+)\s+on\s+(\S+)\s+device\s+(\d+)\s+\[[^\]]*\]\s+(.*)$")
_STARTING = re.compile(r"#\s*Collective test starting:\s*(\w+?)(?:_perf)?(?:_mpi)?\s*$")
_FILE_COLLECTIVE = re.compile(r"(all_reduce|all_gather|reduce_scatter|alltoall|broadcast|reduce|sendrecv|gather|"
                              r"scatter|hypercube)_perf")
_NUMBER = re.compile(r"^-?\d+(?:\.\d+)?(?:e[-+]?\d+)?$", re.IGNORECASE)
_COLUMNS = ("collective", "size_bytes", "count", "dtype", "redop", "root", "in_place", "time_us", "algbw_gbs",
            "busbw_gbs", "wrong", "ranks", "line")


def sniff(head: bytes, filename: str) -> bool:
    """nccl-tests stdout (the ``# nThread .. nGpus`` header) or its ``-J`` JSON (``results`` with ``out_of_place``)."""
    text = head.decode("utf-8", "replace")
    if _HEADER.search(text) or _COLUMN_HEAD.search(text):
        return True
    stripped = text.lstrip()
    return stripped.startswith("{") and '"results"' in text and ('"out_of_place"' in text or '"in_place"' in text)


def _collective_from_name(name: str) -> str | None:
    match = _FILE_COLLECTIVE.search(Path(name).name)
    return match.group(1) if match else None


def _float(token: str) -> float | None:
    return float(token) if _NUMBER.match(token) else None


def _wrong(token: str) -> int | None:
    return fit_int(int(token)) if token.lstrip("-").isdigit() else None


class _Rows:
    def __init__(self) -> None:
        self.data: dict[str, list[object]] = {c: [] for c in _COLUMNS}

    def add(self, **values: object) -> None:
        for column in _COLUMNS:
            self.data[column].append(values.get(column))

    def __len__(self) -> int:
        return len(self.data["size_bytes"])


def _parse_text(source: Path, options: ParseOptions) -> tuple[_Rows, dict[str, Any]]:
    rows = _Rows()
    facts: dict[str, Any] = {"ranks": {}, "collective": _collective_from_name(options.source_name),
                             "recognised": 0, "lines": 0, "nccl_lines": 0}
    pending = ""
    line_no = 0
    for chunk in iter_chunks(source, on_bytes=options.on_bytes, name=options.source_name):
        text = pending + chunk.decode("utf-8", "replace")
        lines = text.split("\n")
        pending = lines.pop()
        for raw in lines:
            line_no += 1
            _line(raw, line_no, rows, facts, options.source_name)
    if pending:
        _line(pending, line_no + 1, rows, facts, options.source_name)
    return rows, facts


def _line(raw: str, line_no: int, rows: _Rows, facts: dict[str, Any], source: str) -> None:
    line = _PREFIX.sub("", raw.rstrip("\r"), count=1).strip()
    if not line:
        return
    facts["lines"] += 1
    if _NCCL_LOG_LINE.search(line):
        facts["nccl_lines"] += 1  # read by the NCCL debug-log parser (mixed.py)
        return
    if line.startswith("#"):
        facts["recognised"] += 1  # nccl-tests' own comments, read or not
        if _HEADER.search(line):
            facts["header"] = line
        elif match := _STARTING.match(line):
            facts["collective"] = match.group(1)
        elif match := _RANK.match(line):
            facts["ranks"][int(match.group(1))] = (match.group(3), fit_int(int(match.group(2))), match.group(5).strip(),
                                                   fit_int(int(match.group(4)), 32))
        return
    tokens = line.split()
    if len(tokens) < 11 or not tokens[0].isdigit() or not tokens[1].isdigit():
        return  # a line of something else (launcher noise, warnings): skipped and counted
    head, tail = tokens[:-8], tokens[-8:]
    middle = head[3:]
    redop = next((t for t in middle if not _NUMBER.match(t)), None)
    root = fit_int(next((int(t) for t in middle if t.lstrip("-").isdigit()), None), 32)
    size, count = fit_int(int(tokens[0])), fit_int(int(tokens[1]))
    if size is None or count is None:
        raise TraceFormatError(source, f"a result row with a size or count beyond 64 bits: {line[:200]!r}",
                               where=f"line {line_no}")
    for offset, in_place in ((0, False), (4, True)):
        time_us, algbw, busbw = (_float(t) for t in tail[offset:offset + 3])
        if time_us is None or algbw is None or busbw is None:
            raise TraceFormatError(source, f"a result row with a non-numeric time or bandwidth: {line[:200]!r}",
                                   where=f"line {line_no}")
        rows.add(size_bytes=size, count=count, dtype=tokens[2], redop=redop, root=root,
                 in_place=in_place, time_us=time_us, algbw_gbs=algbw, busbw_gbs=busbw,
                 wrong=_wrong(tail[offset + 3]), line=line_no)
    facts["recognised"] += 1


def _parse_json(source: Path, options: ParseOptions) -> tuple[_Rows, dict[str, Any]]:
    text = read_whole(source, on_bytes=options.on_bytes, name=options.source_name)
    try:
        doc = json.loads(text)
    except (ValueError, UnicodeDecodeError) as exc:
        raise TraceFormatError(options.source_name, f"invalid JSON ({exc})") from None
    except RecursionError:
        raise TraceFormatError(options.source_name, "JSON nested too deeply: not nccl-tests -J output") from None
    results = doc.get("results") if isinstance(doc, dict) else None
    if not isinstance(results, list):
        raise TraceFormatError(options.source_name, 'no "results" list: not nccl-tests -J output')
    rows = _Rows()
    for index, result in enumerate(results):
        if not isinstance(result, dict) or fit_int(result.get("size")) is None:
            raise TraceFormatError(options.source_name, "a result without an integer size (of at most 64 bits)",
                                   where=f"results[{index}]")
        for key, in_place in (("out_of_place", False), ("in_place", True)):
            part = result.get(key)
            if not isinstance(part, dict):
                continue
            values = [part.get(k) for k in ("time", "alg_bw", "bus_bw")]
            numbers = [float(v) for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
            if len(numbers) != 3:
                raise TraceFormatError(options.source_name, f"non-numeric time or bandwidth in {key}",
                                       where=f"results[{index}]")
            rows.add(size_bytes=result["size"], count=fit_int(result.get("count")), dtype=fit_text(result.get("type")),
                     redop=fit_text(result.get("redop")), root=fit_int(int_field(result.get("root")), 32),
                     in_place=in_place,
                     time_us=numbers[0], algbw_gbs=numbers[1], busbw_gbs=numbers[2], wrong=int_field(part.get("nwrong")))
    collective = doc.get("collective") if isinstance(doc.get("collective"), str) else None
    facts: dict[str, Any] = {"ranks": json_ranks(doc), "collective": _collective_from_name(options.source_name) or collective,
             "nranks": fit_int(doc.get("nranks"), 32)}
    return rows, facts


def parse(source: Path, staging: Path, options: ParseOptions) -> TraceInfo:
    """Parse one nccl-tests output (stdout or ``-J`` JSON) into ``nccl_benchmarks``.

    Raises:
        TraceFormatError: no result rows, or a row that cannot be read (with its line).
    """
    is_json = read_head(source, 64, name=options.source_name).lstrip().startswith(b"{")
    rows, facts = (_parse_json if is_json else _parse_text)(source, options)
    if not len(rows):
        raise TraceFormatError(options.source_name, "nccl-tests output without any result rows")
    ranks: dict[int, tuple[str, int | None, str, int | None]] = facts["ranks"]
    n_ranks = len(ranks) or facts.get("nranks")
    collective, unsure = facts.get("collective"), None
    if not collective:
        collective, unsure = infer_collective(rows.data, n_ranks)
    rows.data["collective"] = [collective or "unknown"] * len(rows)
    rows.data["ranks"] = [n_ranks] * len(rows)
    nodes = len({rank[0] for rank in ranks.values() if rank[0]}) or None
    columns = {k: v for k, v in rows.data.items() if k != "line"}
    write_table(staging, "nccl_benchmarks", {"rank": [0] * len(rows), "nodes": [nodes] * len(rows), **columns},
                trace_id=options.trace_id)
    if ranks:
        write_devices(staging, options.trace_id, ranks)
    info = TraceInfo(format=FORMAT, event_count=len(rows), uncompressed_bytes=source.stat().st_size)
    if unsure:
        info.warnings.append(unsure)
    if facts.get("nccl_lines"):
        read_mixed_log(source, staging, options, info)
    info.world_size = n_ranks
    info.device_count = n_ranks
    if ranks:
        host, pid, device, _ = ranks[min(ranks)]
        info.host, info.pid, info.device_name = host, pid, device
        info.device_type = "cuda" if "nvidia" in device.lower() else "rocm" if "amd" in device.lower() else None
    info.rank_source = "nccl-tests (one file per run)"
    if not is_json and facts["lines"]:
        skipped = facts["lines"] - facts["recognised"] - facts["nccl_lines"]
        if skipped:
            info.warnings.append(f"{skipped} of {facts['lines']} lines were not nccl-tests output and were skipped")
    return info
