"""Writing the ``collectives`` of an NCCL debug log: COLL rows staged in parts, joined and written at the end.

The parser (:mod:`.nccl_log`) hands each chunk's COLL rows, typed, to :class:`Parts`, which
writes them, :data:`PART_ROWS` at a time, as lz4-compressed Arrow IPC files in the staging
directory, so memory stays flat in the size of the log. Once the log is read,
:func:`write_collectives` joins each part with the small facts held whole (the
communicators of the init lines, the TUNING choices) and appends it to
``collectives.parquet`` as one row group, encoded on a second thread while the next part is
joined: an init or TUNING line may come after the COLL lines it describes.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.ipc

from tracelake.contracts import schema
from tracelake.contracts.lazy import polars as pl

from .nccl_ops import PER_RANK_SHARE
from .tables import BackgroundWriter, TableWriter

#: COLL rows held before they are written as one part; each part becomes one row group of ``collectives``.
PART_ROWS = 1 << 17
#: What identifies a communicator: its address in one process (COLL rows are joined with init lines on it).
COMM_KEY = ["host", "pid", "comm"]
#: What a TUNING choice applies to: the process, the op and one rank's buffer bytes.
TUNING_KEY = ["host", "pid", "tuned_op", "tuned_bytes"]

#: Parts are lz4-compressed: uncompressed, they took 115-140 bytes a COLL row, half the log's size on the
#: staging disk while it was parsed. Written as string views (polars' own layout: short strings inline, the
#: rest pointing into a few shared buffers), whose rows repeat, lz4 leaves 2-6 bytes a row on the
#: benchmark's logs (large strings: about 20) and reading them back needs no conversion; the CPU stayed
#: within the noise of the uncompressed parts'.
_PART_OPTIONS = pa.ipc.IpcWriteOptions(compression="lz4")


class Parts:
    """COLL rows of the chunks read so far, in log order: the last ones held, the others written to
    ``folder`` as lz4-compressed Arrow IPC files (:data:`_PART_OPTIONS`) of about ``part_rows`` rows."""

    def __init__(self, folder: Path, part_rows: int = PART_ROWS) -> None:
        self.folder = folder
        self.part_rows = part_rows
        self.rows = 0
        self._held: list[pl.DataFrame] = []
        self._held_rows = 0
        self._files: list[Path] = []

    def add(self, rows: pl.DataFrame) -> None:
        """Append one chunk's rows; write what is held once it reaches ``part_rows``."""
        if not rows.height:
            return
        self._held.append(rows)
        self._held_rows += rows.height
        self.rows += rows.height
        if self._held_rows >= self.part_rows:
            self.folder.mkdir(exist_ok=True)
            path = self.folder / f"part-{len(self._files):06d}.arrow"
            table = pl.concat(self._held, rechunk=False).to_arrow(compat_level=pl.CompatLevel.newest())
            with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema, options=_PART_OPTIONS) as out:
                out.write_table(table)
            self._files.append(path)
            self._held, self._held_rows = [], 0

    def __iter__(self) -> Iterator[pl.DataFrame]:
        """Every part in log order (the written ones read back), a row group's worth at a time."""
        for path in self._files:
            with pa.memory_map(str(path)) as source:  # read once, from the page cache; lz4 decodes into new buffers
                yield pl.DataFrame(pa.ipc.open_file(source).read_all())
        if self._held:
            yield pl.concat(self._held, rechunk=False)

    def remove(self) -> None:
        """Delete the written parts."""
        shutil.rmtree(self.folder, ignore_errors=True)


#: ``collectives``' Parquet encodings: the columns that count up are delta-coded (a dictionary of distinct
#: values would only be built to be dropped), the rest, which repeat, dictionary-coded; zstd at its fastest
#: level, as the encodings leave it little to do. Min/max statistics (a fifth of the writing time when kept
#: for every column) only where readers skip row groups by them: rank and time (``derived``), ids.
_COUNTING = ("event_id", "seq", "ts_ns")
_WRITER_OPTIONS: dict[str, Any] = {
    "compression": "zstd", "compression_level": 1,
    "use_dictionary": [c for c in schema.table("collectives").column_names if c not in _COUNTING],
    "column_encoding": dict.fromkeys(_COUNTING, "DELTA_BINARY_PACKED"),
    "write_statistics": [*_COUNTING, "rank"],
}


#: ``collectives``' Arrow types, which the parts are cast to before they are handed to the writer thread.
_TYPES = {column.name: column.arrow_type for column in schema.table("collectives").columns}


def write_collectives(staging: Path, trace_id: str, parts: Parts, comms: pl.DataFrame,
                      choices: pl.DataFrame | None) -> None:
    """Write ``collectives.parquet`` from the COLL rows in ``parts``, one row group per part.

    Args:
        staging: The trace's staging directory.
        trace_id: The trace the rows belong to.
        parts: The log's COLL rows (the parser's typed rows, :func:`.nccl_log.coll_rows`).
        comms: One row per (host, pid, comm) with what its init lines say (rank, nranks, comm_id where given).
        choices: The TUNING choices, one row per :data:`TUNING_KEY` (None: no TUNING line).
    """
    lookup = _comm_lookup(comms)
    first = 0
    # one part queued at a time: Arrow encodes it on the writer thread while the next part is joined
    with BackgroundWriter(TableWriter(staging, "collectives", trace_id=trace_id, **_WRITER_OPTIONS),
                          pending=1) as writer:
        for part in parts:
            out = _collectives(part, lookup, choices, first)
            first += out.height
            table = out.to_arrow(compat_level=pl.CompatLevel.newest())  # string views: no copy yet
            # cast to the table's types here, not on the writer thread, which encoding Parquet keeps the busier
            writer.write({name: table[name].cast(_TYPES[name]).combine_chunks() for name in table.column_names})


def _comm_lookup(comms: pl.DataFrame) -> pl.DataFrame:
    """Per (host, pid, comm): the rank, the communicator's size and its commId (null where no line said)."""
    columns = {"rank": pl.Int32, "nranks": pl.Int32, "comm_id": pl.String}
    return comms.with_columns(
        pl.lit(None, dtype=dtype).alias(name) for name, dtype in columns.items() if name not in comms.columns
    ).select(pl.col("host").cast(pl.String), pl.col("pid").cast(pl.Int64), pl.col("comm").cast(pl.String),
             "rank", pl.col("nranks").alias("comm_nranks"), "comm_id")


def _collectives(coll: pl.DataFrame, lookup: pl.DataFrame, choices: pl.DataFrame | None, first: int) -> pl.DataFrame:
    """COLL rows as ``collectives`` rows, ``event_id`` counted from ``first``.

    ``coll`` holds the parser's typed columns (``ts_ns``, ``host``, ``pid``, ``comm``, ``op``,
    ``collective``, ``seq``, ``count``, ``size``, ``dtype``, ``root``, ``nranks``, ``stream``).
    The rank, group size and process group come from the init lines of the same (host, pid,
    comm) (``lookup``, :func:`_comm_lookup`); a TUNING line of the same process, op and size
    (``choices``) gives the algorithm, protocol and channel count (NCCL prints it on the
    ranks that tune, usually rank 0).
    """
    frame = coll.join(lookup, on=COMM_KEY, how="left", maintain_order="left")
    count, size, root = pl.col("count"), pl.col("size"), pl.col("root")
    nranks = pl.coalesce(pl.col("nranks"), pl.col("comm_nranks"))
    if choices is not None and choices.height:
        # TUNING prints the bytes of one rank's buffer: count x element size
        frame = frame.with_columns((count * size).alias("buffer_bytes")).join(
            choices, left_on=["host", "pid", "op", "buffer_bytes"], right_on=TUNING_KEY, how="left",
            maintain_order="left")
    else:
        frame = frame.with_columns(pl.lit(None, dtype=pl.String).alias("algorithm"),
                                   pl.lit(None, dtype=pl.String).alias("protocol"),
                                   pl.lit(None, dtype=pl.Int32).alias("channels"))
    message = count * size * pl.when(pl.col("collective").is_in(list(PER_RANK_SHARE))).then(
        nranks.cast(pl.Int64)).otherwise(1)
    return frame.select(
        pl.int_range(first, first + pl.len(), dtype=pl.Int64).alias("event_id"),
        "rank", "collective",
        pl.coalesce("comm_id", "comm").alias("process_group"),
        nranks.alias("group_size"), "seq", "dtype", count.alias("in_nelems"), message.alias("message_bytes"),
        pl.when(pl.col("collective") == "send").then(pl.col("rank"))
        .when(pl.col("collective").is_in(["recv", "broadcast"])).then(root).alias("src_rank"),
        pl.when(pl.col("collective") == "send").then(root)
        .when(pl.col("collective") == "recv").then(pl.col("rank")).alias("dst_rank"),
        "ts_ns", "stream", pl.lit(False).alias("is_async"), "algorithm", "protocol", "channels",
        pl.lit("nccl_log").alias("source"),
    )
