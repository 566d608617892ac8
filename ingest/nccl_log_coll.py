"""The COLL lines of an NCCL debug log (``<op>: opCount ..``, most of a log) as fields and typed rows, by polars.

:mod:`.nccl_log`'s polars path: each line is cut at literal markers rather than matched with one
regular expression of 14 captures (:func:`coll_fields`), and typed once per distinct value
(:func:`coll_rows`). The native scanner (``_nccl_scan.c``, :mod:`.nccl_log_scan`) gives the same
rows where it is built; this path stays as its fallback and as the reference the tests compare with.
"""

from __future__ import annotations

from collections.abc import Callable

from tracelake.contracts.lazy import polars as pl

from .nccl_ops import collective_name

#: docs/formats.md (NCCL debug log): datatype codes -> bytes per element.
DTYPE = {0: ("int8", 1), 1: ("uint8", 1), 2: ("int32", 4), 3: ("uint32", 4), 4: ("int64", 8), 5: ("uint64", 8),
         6: ("float16", 2), 7: ("float32", 4), 8: ("float64", 8), 9: ("bfloat16", 2), 10: ("float8e4m3", 1),
         11: ("float8e5m2", 1)}


_TS = r"\[(\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:\.\d+)?)\]"
#: A timestamp, found without capturing (the regex engine's fast path); it holds no ``]`` up to its end.
_TS_FIND = r"\[\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:\.\d+)?\]"
_ORIGIN = r"(?P<host>[\w.-]+):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>\d+)\]$"
#: What follows ``<op>: opCount <hex> `` in a COLL line: ``_COLL``'s pattern from there on; its buffers, which
#: change from call to call; and what follows them, the same for many calls.
_COLL_NUMBERS = (r"^(?P<count>\d+) datatype (?P<dtype>\d+) op (?P<redop>\d+) root (?P<root>\d+) "
                 r"comm (?P<comm>0x[0-9a-f]+)(?: \[nranks=(?P<nranks>\d+)\])? stream (?P<stream>0x[0-9a-f]+)")
_COLL_TAIL = r"^sendbuff \S+ recvbuff \S+ count " + _COLL_NUMBERS[1:]
_COLL_BUFFERS = r"^sendbuff \S+ recvbuff \S+$"
_COLL_COLUMNS = ("ts", "host", "pid", "tid", "dev", "op", "opcount", "count", "dtype", "redop", "root", "comm",
                 "nranks", "stream")


def _groups_of_distinct(keys: pl.Series, pattern: str) -> pl.DataFrame:
    """``pattern``'s named groups for each distinct value of ``keys`` (column ``key``: the value)."""
    distinct = keys.unique()
    return pl.concat([distinct.to_frame("key"), distinct.str.extract_groups(pattern).struct.unnest()],
                     how="horizontal")


def _cut(column: str, separator: str, first: str, rest: str) -> pl.Expr:
    """``column`` cut at the first ``separator``: ``first`` before it, ``rest`` after it (null when it has none)."""
    return pl.col(column).str.splitn(separator, 2).struct.rename_fields([first, rest])


def _coll_split(lines: pl.Series, ascii: bool = False) -> tuple[pl.DataFrame, pl.DataFrame]:
    """COLL lines cut into ``prefix`` (the origin's key), ``ts``, ``op``, ``opcount`` and ``tail``, with the
    captures of each distinct prefix (``_ORIGIN``; column ``key``: the prefix). ``ascii``: the lines are
    known to be ASCII (else they are checked)."""
    frame = lines.rename("line").to_frame().select(_cut("line", " NCCL INFO ", "prefix", "message")).unnest("line")
    frame = frame.select("prefix", _cut("message", ": opCount ", "op", "after")).unnest("message")
    frame = frame.select("prefix", "op", _cut("after", " ", "opcount", "tail")).unnest("after")
    # The first timestamp (as _TS extracts it), and as the origin's key the prefix without it: _ORIGIN's
    # match lies after any timestamp (it holds no "[" but at its end), so it is the same in what follows.
    prefix, rest = pl.col("prefix"), pl.col("rest")
    found = frame["prefix"].str.find(_TS_FIND)  # the one pass of the regex over every line
    if found.null_count() == found.len():  # NCCL's default: no timestamps on INFO lines
        frame = frame.with_columns(pl.lit(None, dtype=pl.String).alias("ts"))
    elif ascii or (lines.str.len_bytes() == lines.str.len_chars()).all():  # find's byte offsets index characters
        frame = frame.with_columns(prefix.str.slice(found + 1).alias("rest"))
        closing = rest.str.find("]", literal=True)
        frame = frame.with_columns(rest.str.head(closing).alias("ts"),
                                   pl.coalesce(rest.str.slice(closing + 1), prefix).alias("prefix")).drop("rest")
    else:
        frame = frame.with_columns(prefix.str.extract(_TS, 1).alias("ts"), prefix.str.replace(_TS_FIND, " "))
    return frame, _groups_of_distinct(frame["prefix"], _ORIGIN)


def _coll_join(frame: pl.DataFrame, origins: pl.DataFrame,
               convert: Callable[[pl.DataFrame], pl.DataFrame] = lambda groups: groups) -> pl.DataFrame:
    """``frame``'s lines with the fields of their origin and tail; only the well-formed ones (``_COLL`` matches).

    ``convert`` turns a table of distinct values' captures (column ``key``, the named groups
    as strings, ``comm`` null where the pattern did not match) into the columns wanted, once
    per distinct value rather than per line.
    """
    frame = frame.join(origins.with_columns(pl.col("host").is_not_null().alias("origin_ok")), left_on="prefix",
                       right_on="key", how="left", maintain_order="left")
    # The tail's buffers are checked per line (no captures); what follows them is captured once per distinct value.
    frame = frame.with_columns(_cut("tail", " count ", "buffers", "numbers").alias("cut")).unnest("cut")
    numbers = convert(_groups_of_distinct(frame["numbers"], _COLL_NUMBERS))
    fields = [c for c in numbers.columns if c != "key"]
    frame = frame.join(numbers, left_on="numbers", right_on="key", how="left", maintain_order="left")
    frame = frame.with_columns(
        (pl.col("comm").is_not_null() & pl.col("buffers").str.contains(_COLL_BUFFERS)).fill_null(False)
        .alias("tail_ok"))
    if not frame["tail_ok"].all():  # damaged lines, or a buffer named "count": their whole tail by the pattern
        whole = convert(_groups_of_distinct(frame.filter(~pl.col("tail_ok"))["tail"], _COLL_TAIL))
        frame = frame.join(whole.rename({c: f"{c}_whole" for c in fields}), left_on="tail", right_on="key",
                           how="left", maintain_order="left")
        frame = frame.with_columns(
            *(pl.when("tail_ok").then(pl.col(c)).otherwise(pl.col(f"{c}_whole")).alias(c) for c in fields),
            (pl.col("tail_ok") | pl.col("comm_whole").is_not_null()).alias("tail_ok"))
    ok = pl.col("origin_ok") & pl.col("tail_ok") & pl.col("op").str.contains(r"^\w+$") \
        & pl.col("opcount").str.contains(r"^[0-9a-f]+$")
    return frame.filter(ok.fill_null(False))


def coll_fields(lines: pl.Series) -> pl.DataFrame:
    """The fields of COLL lines (``_COLL``'s named groups, as strings); lines that are not well-formed are left out.

    The same fields as extracting ``_COLL[1]``'s groups from every line (a test keeps them
    equal on well-formed and damaged lines), many times faster: regex captures are slow, so
    each line is only cut at literal markers (``" NCCL INFO "``, ``": opCount "``, the space
    after the opCount) and its timestamp found without capturing; the captures run once per
    *distinct* ``host:pid:tid [dev]`` prefix and per distinct ``count .. stream ..`` end of
    the message (a job's collectives repeat their counts, types, communicators and
    streams), and are joined back; the buffers before that end are only checked. Unlike
    the pattern, any launcher prefix before ``host:pid:tid`` is accepted.
    """
    return _coll_join(*_coll_split(lines)).select(_COLL_COLUMNS)


def coll_rows(lines: pl.Series, ascii: bool = False) -> pl.DataFrame:
    """COLL lines as typed columns (what :func:`.nccl_log_writer.write_collectives` needs; the numbers of
    :func:`coll_fields`, cast once).

    A chunk's rows wait in a part until the end of the log, so they are made small at once: numbers
    and names are converted on the distinct prefixes and message ends, per line only the timestamp
    and the opCount. ``ascii``: the lines are known to be ASCII.
    """
    frame, origins = _coll_split(lines, ascii)
    origins = origins.select("key", "host", _i64("pid"))
    names = {name: collective_name(name) for name in frame["op"].unique().drop_nulls().to_list()}
    code = _i64("dtype")

    def typed(groups: pl.DataFrame) -> pl.DataFrame:
        return groups.select(
            "key", "comm", _i64("count"), code.replace_strict({k: v[1] for k, v in DTYPE.items()}, default=None,
                                                              return_dtype=pl.Int64).alias("size"),
            code.replace_strict({k: v[0] for k, v in DTYPE.items()}, default=pl.col("dtype"),
                                return_dtype=pl.String).alias("dtype"),
            _i32("root"), _i32("nranks"),
            (pl.col("stream").str.slice(2).str.to_integer(base=16, strict=False) % (1 << 62)).alias("stream"),
        )

    stamps = frame["ts"]
    if stamps.null_count() == stamps.len():  # a log without timestamps (the default but for WARN lines)
        ts_ns = pl.lit(None, dtype=pl.Int64)
    elif stamps.str.contains("T", literal=True).any():
        ts_ns = pl.col("ts").str.replace(" ", "T").str.to_datetime("%Y-%m-%dT%H:%M:%S%.f", time_unit="ns",
                                                                  strict=False).dt.epoch("ns")
    else:  # NCCL's default "%F %T": parsed as it is, without the copy that replacing the space makes
        ts_ns = pl.col("ts").str.to_datetime("%Y-%m-%d %H:%M:%S%.f", time_unit="ns", strict=False).dt.epoch("ns")
    return _coll_join(frame, origins, typed).select(
        ts_ns.alias("ts_ns"), "host", "pid", "comm", "op",
        pl.col("op").replace_strict(names, return_dtype=pl.String).alias("collective"),
        pl.col("opcount").str.to_integer(base=16, strict=False).alias("seq"),
        "count", "size", "dtype", "root", "nranks", "stream",
    )


def _i32(name: str) -> pl.Expr:
    """A captured number as Int32, null where it does not fit (a damaged log's 20-digit rank must not stop it)."""
    return pl.col(name).cast(pl.Int32, strict=False)


def _i64(name: str) -> pl.Expr:
    """A captured number as Int64, null where it does not fit."""
    return pl.col(name).cast(pl.Int64, strict=False)
