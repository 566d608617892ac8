"""What ``tracelake check`` reads under ``tables/``: what fits the layout, what does not, and each file's footer.

The layout is ``tables/<table>/job=<job>/<trace_id>.parquet`` for every declared table,
plus one ``job=_schema/_schema.parquet`` per table and the hidden temporary files of
writers (:data:`.store.TEMP_FILE`). Anything else (an unknown table folder, a file
named otherwise, a folder or link inside a job folder, a job folder with an invalid
name) is *stray*: no ingest writes it, so it came from a bug or from someone writing
to the warehouse behind tracelake's back.

A file in its place can still be wrong: its footer is read (never its data, except
the ``trace_id`` column of a file whose statistics do not name its trace) and its
schema must be the declared one, as the store writes it. Files written under an older
schema may lack columns added since (views merge files by column name and fill
nulls), but a column of another type, an unknown column, columns out of order, or rows
of another trace change what every query over the table sees (one ``rank`` stored as
text turns the whole column into text for every reader, and listings fail).

``tracelake check --repair`` moves what is wrong aside into a :class:`Quarantine`
folder (never deleting it: it is evidence, and may be all that is left of a trace).
"""

from __future__ import annotations

import datetime as dt
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tracelake.contracts import schema
from tracelake.contracts.errors import InvalidArgument

from .store import _TRACE_ID, SCHEMA_JOB, TEMP_FILE, Store, check_job

#: The folder under the warehouse home that ``check --repair`` moves what does not belong into; no view reads it.
QUARANTINE = "quarantine"

#: What can be wrong with a file in its place: not Parquet (or not readable), another schema, rows of
#: another trace, or a row count a file of its kind never has (a ``traces`` file holds one row, a schema file none).
FileFault = Literal["unreadable", "schema", "foreign", "rows"]


@dataclass(frozen=True)
class DataFile:
    """A file where a trace's table file goes: ``tables/<table>/job=<job>/<trace_id>.parquet``."""

    table: str
    job: str
    trace_id: str
    path: Path


@dataclass
class Layout:
    """Everything under ``tables/``, by what it is."""

    files: list[DataFile] = field(default_factory=list)
    #: The ``_schema`` file of each table that has one.
    schema_files: dict[str, Path] = field(default_factory=dict)
    #: Hidden temporary files of writers (live or dead: :mod:`.check` tells).
    temps: list[Path] = field(default_factory=list)
    #: ``(path, why it does not fit)``.
    strays: list[tuple[Path, str]] = field(default_factory=list)


def _entries(folder: str | Path) -> list[os.DirEntry[str]]:
    with os.scandir(folder) as it:
        return sorted(it, key=lambda e: e.name)


def _is_temp(entry: os.DirEntry[str]) -> bool:
    return bool(TEMP_FILE.match(entry.name)) and entry.is_file(follow_symlinks=False)


def _valid_job(job: str) -> bool:
    try:
        check_job(job)
    except InvalidArgument:
        return False
    return True


def walk(store: Store) -> Layout:
    """Sort every entry under ``tables/`` into trace files, schema files, temporary files and strays."""
    layout = Layout()
    if not store.tables.is_dir():
        return layout
    for table in _entries(store.tables):
        if table.name not in schema.TABLES:
            layout.strays.append((Path(table.path), "not a table of the warehouse"))
            continue
        if not table.is_dir(follow_symlinks=False):
            layout.strays.append((Path(table.path), "a table folder that is a file or a link"))
            continue
        for folder in _entries(table.path):
            if _is_temp(folder):
                layout.temps.append(Path(folder.path))
                continue
            job = folder.name[4:] if folder.name.startswith("job=") else None
            if job is None or not (job == SCHEMA_JOB or _valid_job(job)):
                layout.strays.append((Path(folder.path), "not named job=<job> with a valid job name"))
                continue
            if not folder.is_dir(follow_symlinks=False):
                layout.strays.append((Path(folder.path), "a job folder that is a file or a link"))
                continue
            for entry in _entries(folder.path):
                path = Path(entry.path)
                stem = entry.name.removesuffix(".parquet")
                if _is_temp(entry):
                    layout.temps.append(path)
                elif not entry.is_file(follow_symlinks=False):
                    layout.strays.append((path, "a folder, link or special file inside a job folder"))
                elif job == SCHEMA_JOB:
                    if entry.name == f"{SCHEMA_JOB}.parquet":
                        layout.schema_files[table.name] = path
                    else:
                        layout.strays.append((path, f"not {SCHEMA_JOB}.parquet in the schema folder"))
                elif entry.name.endswith(".parquet") and _TRACE_ID.match(stem):
                    layout.files.append(DataFile(table.name, job, stem, path))
                else:
                    layout.strays.append((path, "not named <trace id>.parquet"))
    return layout


@dataclass(frozen=True)
class Footer:
    """What a file's footer says: its rows, and what is wrong with it (``fault`` None: nothing)."""

    rows: int | None
    fault: FileFault | None = None
    detail: str = ""
    #: The file itself is at fault (not an I/O error that may pass): ``--repair`` moves it aside.
    movable: bool = True


def schema_fault(found: pa.Schema, tbl: schema.Table, *, exact: bool = False) -> str | None:
    """What is wrong with a file's schema for ``tbl`` (None: nothing).

    Columns must have the declared names and types, in the declared order; ``trace_id``
    must be there. Other declared columns may be missing (files written under an older
    schema) unless ``exact``.
    """
    declared = {f.name: f.type for f in tbl.arrow_schema}
    names = found.names
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        return f"columns {', '.join(twice)} appear more than once"
    unknown = [n for n in names if n not in declared]
    if unknown:
        return f"columns not in the declared schema of {tbl.name}: {', '.join(unknown)}"
    wrong = [f"{f.name} is {f.type}, declared {declared[f.name]}" for f in found if not f.type.equals(declared[f.name])]
    if wrong:
        return "; ".join(wrong)
    if names != [n for n in tbl.column_names if n in names]:
        return f"columns not in the declared order of {tbl.name}"
    missing = [n for n in tbl.column_names if n not in names]
    if "trace_id" in missing or (exact and missing):
        return f"columns missing: {', '.join(missing)}"
    return None


def inspect(path: Path, table: str, trace_id: str | None) -> Footer:
    """Read ``path``'s footer and check it against ``table``; ``trace_id`` None: a ``_schema`` file.

    The rows' trace ids are taken from the column statistics, read only where those
    do not name the file's trace alone (a writer may leave statistics out).
    """
    try:
        meta = pq.read_metadata(path)
        fault = schema_fault(meta.schema.to_arrow_schema(), schema.TABLES[table], exact=trace_id is None)
    except pa.ArrowException as exc:
        return Footer(None, "unreadable", f"not a readable Parquet file: {exc}")
    except OSError as exc:
        return Footer(None, "unreadable", f"cannot be read: {exc.strerror or exc}", movable=False)
    rows = meta.num_rows
    if fault is not None:
        return Footer(rows, "schema", fault)
    if trace_id is None:
        return Footer(rows, "rows", f"holds {rows} rows; a schema file holds none") if rows else Footer(rows)
    if table == "traces" and rows != 1:
        return Footer(rows, "rows", f"holds {rows} rows; a registration holds one")
    if rows and not _names_only(meta, trace_id):
        try:
            ids = pq.read_table(path, columns=["trace_id"]).column(0)
        except pa.ArrowException as exc:
            return Footer(rows, "unreadable", f"trace_id column unreadable: {exc}")
        others = sorted(set(pc.unique(ids.drop_null()).to_pylist()) - {trace_id})
        if others:
            shown = ", ".join(others[:3]) + (f" and {len(others) - 3} more" if len(others) > 3 else "")
            return Footer(rows, "foreign", f"holds rows of other traces ({shown})")
    return Footer(rows)


def _names_only(meta: pq.FileMetaData, trace_id: str) -> bool:
    """Whether every row group's statistics say its ``trace_id`` (the first column) is ``trace_id`` alone."""
    for group in range(meta.num_row_groups):
        column = meta.row_group(group).column(0)
        stats = column.statistics
        if (column.path_in_schema != "trace_id" or stats is None or not stats.has_min_max
                or stats.min != trace_id or stats.max != trace_id):
            return False
    return True


class Quarantine:
    """Where one repair moves what does not belong: ``<home>/quarantine/<UTC time>/<path under home>``.

    The folder is made on the first move, private to the warehouse's owner; a move is a
    rename within the warehouse's file system (a link moves as a link, a folder whole).
    """

    def __init__(self, home: Path) -> None:
        self.home = home
        self.root: Path | None = None

    def move(self, path: Path) -> Path:
        """Move ``path`` (under the home) into the quarantine folder; returns where it went."""
        root = self.root = self.root or self._new_root()
        target = root / path.relative_to(self.home)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.rename(path, target)
        return target

    def _new_root(self) -> Path:
        base = self.home / QUARANTINE
        base.mkdir(mode=0o700, exist_ok=True)
        stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
        n = 0
        while True:
            root = base / (stamp if n == 0 else f"{stamp}-{n}")
            try:
                root.mkdir(mode=0o700)
            except FileExistsError:  # another repair in the same second
                n += 1
                continue
            return root
