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

from tracelake.contracts.errors import TraceFormatError

from .model import ParseOptions, TraceInfo
from .nccl_tests_facts import (
    infer_collective,
    int_field,
    version_text,
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
_STARTING = re.compile(r"#\s*Collective test starting:\s*(?:\S*/)?(\w+?)(?:_perf)?(?:_mpi)?\s*$")
#: The first line of a run in current builds (``# nccl-tests version 2.17.6 nccl-headers=22703 ...``).
_VERSION_LINE = re.compile(r"#\s*nccl-tests version\s")
#: The column header; with ``-R``/per-iteration timing each half has four more columns (``i_min`` ..), and
#: with timestamps a date and time end the row.
_COLUMNS_LINE = re.compile(r"#\s+size\s+count\s+type\b.*\b(?:time|cputime)\b")
_FILE_COLLECTIVE = re.compile(r"(all_reduce|all_gather|reduce_scatter|alltoall|broadcast|reduce|sendrecv|gather|"
                              r"scatter|hypercube)_perf")
_NUMBER = re.compile(r"^-?\d+(?:\.\d+)?(?:e[-+]?\d+)?$", re.IGNORECASE)
_COLUMNS = ("collective", "size_bytes", "count", "dtype", "redop", "root", "in_place", "time_us", "algbw_gbs",
            "busbw_gbs", "wrong", "ranks", "nodes", "line", "section")
#: Kept while parsing, not stored.
_INTERNAL = ("line", "section")


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
                             "recognised": 0, "lines": 0, "nccl_lines": 0, "sections": [_section()],
                             "half": 4, "trailing": 0}
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


def _section() -> dict[str, Any]:
    """One run of a ``*_perf`` binary within a stdout: its collective (when it names it) and rank lines."""
    return {"collective": None, "ranks": {}, "rows": 0, "started": False}


def _start(facts: dict[str, Any]) -> dict[str, Any]:
    """The section a run's first line belongs to: a new one when the current one already holds results or
    rank lines of an earlier run (several runs appended to one file)."""
    current: dict[str, Any] = facts["sections"][-1]
    if current["rows"] or current["ranks"] or current["started"]:
        current = _section()
        facts["sections"].append(current)
    current["started"] = True
    return current


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
        section = facts["sections"][-1]
        if _VERSION_LINE.match(line):
            _start(facts)
        elif match := _STARTING.match(line):
            if section["collective"] or section["rows"] or section["ranks"]:
                section = _start(facts)
            section["started"] = True
            section["collective"] = match.group(1)
        elif _HEADER.search(line):
            facts["header"] = line
            if section["rows"] or section["ranks"]:
                _start(facts)
        elif match := _RANK.match(line):
            if section["rows"]:
                section = _start(facts)
            rank = (match.group(3), fit_int(int(match.group(2))), match.group(5).strip(), fit_int(int(match.group(4)), 32))
            section["ranks"][int(match.group(1))] = facts["ranks"][int(match.group(1))] = rank
        elif _COLUMNS_LINE.match(line):
            facts["half"] = 8 if "i_min" in line else 4
            facts["trailing"] = 2 if "timestamp" in line else 0
        return
    tokens = line.split()
    half, trailing = facts["half"], facts["trailing"]
    if trailing:
        tokens = tokens[:-trailing]
    if len(tokens) < 3 + 2 * half or not tokens[0].isdigit() or not tokens[1].isdigit():
        return  # a line of something else (launcher noise, warnings): skipped and counted
    head, tail = tokens[:-2 * half], tokens[-2 * half:]
    middle = head[3:]
    redop = next((t for t in middle if not _NUMBER.match(t)), None)
    root = fit_int(next((int(t) for t in middle if t.lstrip("-").isdigit()), None), 32)
    size, count = fit_int(int(tokens[0])), fit_int(int(tokens[1]))
    if size is None or count is None:
        raise TraceFormatError(source, f"a result row with a size or count beyond 64 bits: {line[:200]!r}",
                               where=f"line {line_no}")
    for offset, in_place in ((0, False), (half, True)):
        time_us, algbw, busbw = (_float(t) for t in tail[offset:offset + 3])
        if time_us is None or algbw is None or busbw is None:
            raise TraceFormatError(source, f"a result row with a non-numeric time or bandwidth: {line[:200]!r}",
                                   where=f"line {line_no}")
        rows.add(size_bytes=size, count=count, dtype=tokens[2], redop=redop, root=root,
                 in_place=in_place, time_us=time_us, algbw_gbs=algbw, busbw_gbs=busbw,
                 wrong=_wrong(tail[offset + 3]), line=line_no, section=len(facts["sections"]) - 1)
    facts["sections"][-1]["rows"] += 1
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
            # ``cpu_time`` in place of ``time`` when run with -C; a NaN is written as the string "nan"
            values = [part.get("time", part.get("cpu_time")), part.get("alg_bw"), part.get("bus_bw")]
            numbers = [float(v) for v in values if isinstance(v, int | float) and not isinstance(v, bool)
                       or v == "nan"]
            if len(numbers) != 3:
                raise TraceFormatError(options.source_name, f"non-numeric time or bandwidth in {key}",
                                       where=f"results[{index}]")
            rows.add(size_bytes=result["size"], count=fit_int(result.get("count")), dtype=fit_text(result.get("type")),
                     redop=fit_text(result.get("redop")), root=fit_int(int_field(result.get("root")), 32),
                     in_place=in_place,
                     time_us=numbers[0], algbw_gbs=numbers[1], busbw_gbs=numbers[2], wrong=int_field(part.get("nwrong")))
    args = doc.get("args")
    program = args[0] if isinstance(args, list) and args and isinstance(args[0], str) else ""
    collective = doc.get("collective") if isinstance(doc.get("collective"), str) else None
    facts: dict[str, Any] = {"ranks": json_ranks(doc), "nranks": fit_int(doc.get("nranks"), 32),
                             "collective": _collective_from_name(options.source_name) or _collective_from_name(program)
                             or collective, "nccl_version": version_text(doc.get("nccl_version"))}
    return rows, facts


def _label_sections(rows: _Rows, facts: dict[str, Any]) -> list[str]:
    """Give each row its run's collective, rank count and node count; the warnings of runs whose
    collective could not be told. A run's collective comes from its ``# Collective test starting`` line,
    else (one run only) the file name or the JSON's program, else busbw/algbw."""
    sections: list[dict[str, Any]] = facts.get("sections") or [{"collective": None, "ranks": facts["ranks"]}]
    if "section" not in rows.data or not any(s is not None for s in rows.data["section"]):
        rows.data["section"] = [0] * len(rows)
    warnings: list[str] = []
    for index, section in enumerate(sections):
        picked = [i for i, s in enumerate(rows.data["section"]) if s == index]
        if not picked:
            continue
        ranks = section["ranks"] or (facts["ranks"] if len(sections) == 1 else {})
        n_ranks = len(ranks) or facts.get("nranks")
        nodes = len({rank[0] for rank in ranks.values() if rank[0]}) or None
        collective = section["collective"] or (facts.get("collective") if len(sections) == 1 else None)
        if not collective:
            subset = {k: [rows.data[k][i] for i in picked] for k in ("algbw_gbs", "busbw_gbs", "redop", "root")}
            collective, unsure = infer_collective(subset, n_ranks)
            if unsure:
                where = f"run {index + 1} of {len(sections)}: " if len(sections) > 1 else ""
                warnings.append(where + unsure)
        for i in picked:
            rows.data["collective"][i] = collective or "unknown"
            rows.data["ranks"][i] = n_ranks
            rows.data["nodes"][i] = nodes
    return warnings


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
    unsure = _label_sections(rows, facts)
    n_ranks = max((r for r in rows.data["ranks"] if isinstance(r, int)), default=None)
    columns = {k: v for k, v in rows.data.items() if k not in _INTERNAL}
    write_table(staging, "nccl_benchmarks", {"rank": [0] * len(rows), **columns}, trace_id=options.trace_id)
    if ranks:
        write_devices(staging, options.trace_id, ranks)
    info = TraceInfo(format=FORMAT, event_count=len(rows), uncompressed_bytes=source.stat().st_size)
    info.warnings.extend(unsure)
    if facts.get("nccl_version") and not info.nccl_version:
        info.nccl_version = facts["nccl_version"]
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
