"""How ``tracelake`` prints analyses in a terminal: breakdown tables, kernel names, the trace list.

Presentation only, over frames the facade returns: JSON output (``--json``, ``--format json``)
keeps every value whole; these helpers decide what a terminal of a given width shows.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text
from tracelake.contracts.lazy import polars as pl
from tracelake.warehouse.results import QueryResult

#: The exclusive buckets of the breakdown (docs/analyses.md, "Breakdown"): they add up to ``span_ns``.
EXCLUSIVE = (
    ("compute_only_ns", "compute only"),
    ("compute_communication_ns", "compute+comm"),
    ("communication_only_ns", "comm only"),
    ("memory_only_ns", "memory only"),
    ("other_overlap_ns", "other mix"),
    ("idle_ns", "idle"),
)
#: Columns around the kernel name in the top-kernels and diff tables take about this many characters.
KERNEL_TABLE_OTHERS = 53
#: A kernel name is never cut shorter than this (rich folds it when the terminal is narrower).
KERNEL_MIN_WIDTH = 24


def frame_result(frame: pl.DataFrame) -> QueryResult:
    """A polars frame as a :class:`QueryResult`, for :func:`tracelake.api.output.to_table`."""
    return QueryResult(list(frame.columns), [str(t) for t in frame.dtypes], [tuple(r) for r in frame.iter_rows()])


def _share(column: str, label: str) -> pl.Expr:
    return pl.when(pl.col("span_ns") > 0).then(100 * pl.col(column) / pl.col("span_ns")).round(1).alias(label)


def _run(frame: pl.DataFrame) -> list[str]:
    """``["run"]`` when the rows span several runs of a job (docs/analyses.md, "Runs within a job")."""
    return ["run"] if "run" in frame.columns else []


def exclusive_view(whole: pl.DataFrame) -> pl.DataFrame:
    """Each rank's span cut into the exclusive buckets, % of the span; ``total`` shows they add up to 100.

    ``compute+comm`` is communication hidden by compute; ``other mix`` any overlap with a memory op.
    """
    total = pl.sum_horizontal(pl.col(c).fill_null(0) for c, _ in EXCLUSIVE)
    return whole.select(
        *_run(whole), "rank", (pl.col("span_ns") / 1e6).round(2).alias("span ms"),
        *(_share(column, label) for column, label in EXCLUSIVE),
        pl.when(pl.col("span_ns") > 0).then(100 * total / pl.col("span_ns")).round(1).alias("total"),
    )


def inclusive_view(whole: pl.DataFrame) -> pl.DataFrame:
    """Each op class's union, % of the span: overlapping time counts in every class it belongs to."""
    columns = [
        *_run(whole), "rank", _share("compute_ns", "compute %"), _share("communication_ns", "comm %"),
        _share("exposed_communication_ns", "exposed comm %"),
        pl.col("overlap_pct").round(1).alias("% of comm hidden"), _share("memory_ns", "memory %"),
    ]
    # XLA traces: async collective windows nothing covered, and FLOPs against the device's peak.
    if "async_collective_ns" in whole.columns and whole["async_collective_ns"].fill_null(0).sum() > 0:
        columns.append(_share("exposed_async_collective_ns", "async exposed %"))
    if "flops_utilisation_pct" in whole.columns and whole["flops_utilisation_pct"].is_not_null().any():
        columns.append(pl.col("flops_utilisation_pct").round(1).alias("FLOPs util %"))
    if "mfu_pct" in whole.columns and whole["mfu_pct"].is_not_null().any():  # docs/analyses.md, "Operators"
        columns.append(pl.col("mfu_pct").round(1).alias("MFU %"))
    if "hfu_pct" in whole.columns and (whole["hfu_pct"] - whole["mfu_pct"]).abs().fill_null(0).max() or 0:
        columns.append(pl.col("hfu_pct").round(1).alias("HFU %"))  # only where recomputation is visible
    return whole.select(columns)


def _bare(name: str) -> str:
    """A kernel name as it identifies the kernel at a glance: no ``void ``, no trailing parameter list."""
    text = name.removeprefix("void ")
    if text.endswith(")") and "(" in text:
        depth = 0
        for i in range(len(text) - 1, -1, -1):
            depth += {")": 1, "(": -1}.get(text[i], 0)
            if depth == 0:
                return text[:i].rstrip() or text
    return text


def _elide(text: str, width: int, differs_at: int) -> str:
    """``text`` in about ``width`` characters: its start, the place where it differs from the names most like it
    (``differs_at``) and its end, with ``…`` for what is left out."""
    if len(text) <= width:
        return text
    tail = max(6, width // 4)
    head = width - 1 - tail
    if differs_at < head or differs_at >= len(text) - tail:  # the difference shows in the head or the tail
        return text[:head] + "…" + text[-tail:]
    segment = max(6, width // 4)
    head = max(4, width - tail - segment - 2)
    # from the start of the word that differs (``gelu_backward``, not ``u_backward``), keeping the difference in view
    word = max(text.rfind(c, head, differs_at) for c in ":<>, ") + 1
    start = max(head, word, differs_at - segment + 1)
    if start + segment >= len(text) - tail:
        return text[:head] + "…" + text[start:]
    return text[:head] + "…" + text[start:start + segment] + "…" + text[-tail:]


def _common(a: str, b: str) -> int:
    """Length of the common start of ``a`` and ``b``."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def kernel_labels(names: Sequence[str | None], width: int) -> list[str]:
    """Terminal labels for kernel ``names``: short, but two different names never print the same.

    Names lose ``void `` and their parameter list unless that makes two alike, then keep their
    start, the place where they differ from the names most like them, and their end, in about
    ``width`` characters; where labels still coincide, the width grows until they differ (up to
    the whole name, which the table then wraps).
    """
    full = ["" if n is None else n for n in names]
    bare = [_bare(n) for n in full]
    owners: dict[str, set[str]] = {}
    for b, f in zip(bare, full):
        owners.setdefault(b, set()).add(f)
    base = [b if len(owners[b]) == 1 else f for b, f in zip(bare, full)]
    ordered = sorted(set(base))
    differs = {name: max([_common(name, o) for o in ordered[max(0, i - 1):i + 2] if o != name], default=0)
               for i, name in enumerate(ordered)}
    distinct = len(set(full))
    longest = max((len(b) for b in base), default=0)
    w = max(width, KERNEL_MIN_WIDTH)
    while w < longest:
        labels = [_elide(b, w, differs[b]) for b in base]
        if len(set(labels)) == distinct:
            return labels
        w += 8
    return base


def kernel_width(console_width: int) -> int:
    """Characters the kernel column may take in a table with the usual numeric columns beside it."""
    return max(KERNEL_MIN_WIDTH, console_width - KERNEL_TABLE_OTHERS)


def rank_ranges(ranks: Sequence[int]) -> str:
    """Ranks as ranges, e.g. ``0-3,8``."""
    values = sorted(set(ranks))
    parts: list[str] = []
    i = 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and values[j + 1] == values[j] + 1:
            j += 1
        parts.append(str(values[i]) if i == j else f"{values[i]}-{values[j]}")
        i = j + 1
    return ",".join(parts)


def traces_table(rows: list[dict[str, Any]], title: str, console: Console, id_length: int) -> Table:
    """The trace list for a terminal: every column when it fits, else ids cut to ``id_length`` (unique prefixes,
    which every command takes) and the fewest columns dropped, so that no id wraps.

    ``rows`` hold ``trace_id``, ``job``, ``ranks`` (text), ``format``, ``source_name``, ``device_name``,
    ``device_op_count``, ``span_ms`` and ``ingested_at``.
    """
    layouts: list[tuple[int | None, tuple[str, ...]]] = [
        (None, ("job", "run", "ranks", "format", "source_name", "device_name", "device_op_count", "span_ms", "ingested_at")),
        (id_length, ("job", "run", "ranks", "format", "source_name", "device_name", "device_op_count", "span_ms",
                     "ingested_at")),
        (id_length, ("job", "run", "ranks", "format", "source_name", "device_op_count", "span_ms", "ingested_at")),
        (id_length, ("job", "run", "ranks", "format", "source_name", "span_ms", "ingested_at")),
        (id_length, ("job", "run", "ranks", "source_name", "span_ms")),
    ]
    table = Table()
    for cut, columns in layouts:
        table = _traces_layout(rows, title, cut, columns)
        # every column at its least width, padding 1 on each side of each column, edges not padded
        if sum(c.min_width or 0 for c in table.columns) + 3 * (len(table.columns) - 1) + 2 <= console.width:
            break
    return table


_HEADINGS = {"trace_id": "trace", "job": "job", "run": "run", "ranks": "ranks", "format": "format", "source_name": "file",
             "device_name": "device", "device_op_count": "device ops", "span_ms": "span ms",
             "ingested_at": "ingested (UTC)"}
_NO_WRAP = {"trace_id", "ranks", "device_op_count", "span_ms", "ingested_at"}
_NUMERIC = {"device_op_count", "span_ms"}
#: The fewest characters a wrapping column of the trace list gets (else a layout with fewer columns is taken).
TEXT_MIN_WIDTH = 10


def _traces_layout(rows: list[dict[str, Any]], title: str, cut: int | None,
                   columns: tuple[str, ...]) -> Table:
    table = Table(title=title, box=box.SIMPLE_HEAD, header_style="bold", pad_edge=False)
    names = ("trace_id", *columns)
    cells = [[_traces_cell(name, str(row.get(name))[:cut] if name == "trace_id" and cut else row.get(name))
              for name in names] for row in rows]
    for i, name in enumerate(names):
        # a text column may wrap, but never below its heading or TEXT_MIN_WIDTH characters (nor its longest value)
        longest = max([len(_HEADINGS[name]), *(len(r[i]) for r in cells)])
        table.add_column(_HEADINGS[name], justify="right" if name in _NUMERIC else "left",
                         no_wrap=name in _NO_WRAP, overflow="fold",
                         min_width=longest if name in _NO_WRAP
                         else min(longest, max(TEXT_MIN_WIDTH, len(_HEADINGS[name]))))
    for r in cells:
        table.add_row(*(Text(c) for c in r))
    return table


def _traces_cell(name: str, value: Any) -> str:
    if value is None:
        return ""
    if name == "ingested_at" and isinstance(value, dt.datetime):
        return value.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M")
    if name == "span_ms" and isinstance(value, float):
        return f"{value:,.1f}"
    if name == "device_op_count" and isinstance(value, int):
        return f"{value:,}"
    return str(value)


def failure_line(path: Path, error: str | None) -> str:
    """An ingest failure as ``<full path>: what went wrong``: parsers name the file by its name alone."""
    full = str(Path(path).absolute())
    text = error or "failed"
    name = Path(path).name
    for prefix in (full, str(path), name):
        if text.startswith(prefix + ":"):
            return full + text[len(prefix):]
    return f"{full}: {text}"
