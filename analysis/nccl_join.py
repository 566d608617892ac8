"""Joining NCCL's own records onto the profiler's collectives: each kernel with its algorithm, protocol, channels.

A PyTorch profiler trace knows each collective's process group and sequence number
(``Seq``) and links it to its NCCL kernel; NCCL's records (profiler plugin ``COLL``
events, Inspector, debug logs) know the communicator, their own sequence number and,
for the plugin, the algorithm, protocol and channel count NCCL chose. Neither names
the other, so per rank each process group is matched to the communicator whose
sequence of operations lines up with it: the offset between the two numberings
(PyTorch counts from 1, NCCL from 0, a communicator created later starts later) is the
one under which the most operations agree, and a match needs most of the overlap to
agree. A communicator named like the process group (NCCL's ``comm_name``) is preferred.
"""

from __future__ import annotations

from collections import Counter

import polars as pl

from .nccl import NCCL_RECORD_FORMATS

#: Share of the overlapping operations that must agree for a process group and a communicator to match.
MIN_AGREEMENT = 0.9
#: Fewest operations that must agree.
MIN_AGREEING = 2
_TUNING = ("algorithm", "protocol", "channels")
COLUMNS = {
    "trace_id": pl.String, "rank": pl.Int32, "process_group": pl.String, "seq": pl.Int64, "collective": pl.String,
    "kernel_event_id": pl.Int64, "kernel_name": pl.String, "message_bytes": pl.Int64, "dur_ns": pl.Int64,
    "algorithm": pl.String, "protocol": pl.String, "channels": pl.Int32,
    "nccl_trace_id": pl.String, "communicator": pl.String, "nccl_seq": pl.Int64,
}


def operation(name: str | None) -> str:
    """One spelling per operation for PyTorch's and NCCL's names: ``_allgather_base`` and ``AllGather`` -> ``allgather``."""
    text = (name or "").lower().strip("_").removesuffix("_base").removesuffix("_into_tensor")
    return text.replace("_", "").replace("alltoallv", "alltoall").replace("alltoallbase", "alltoall")


def tuned_collectives(collectives: pl.DataFrame, traces: pl.DataFrame) -> pl.DataFrame:
    """The profiler's collectives that NCCL's records explain, with NCCL's algorithm, protocol and channels.

    ``collectives`` and ``traces`` are rows of one job's traces (the ``traces`` rows
    give each trace's format). One row per matched profiler collective; see :data:`COLUMNS`.
    """
    if collectives.is_empty() or traces.is_empty():
        return pl.DataFrame(schema=COLUMNS)
    formats = traces.select("trace_id", "format")
    rows = collectives.join(formats, on="trace_id").filter(
        pl.col("seq").is_not_null() & pl.col("rank").is_not_null() & pl.col("process_group").is_not_null()
    )
    profiler = rows.filter(pl.col("format") == "pytorch_profiler")
    records = rows.filter(
        pl.col("format").is_in(NCCL_RECORD_FORMATS)
        & pl.any_horizontal(*(pl.col(c).is_not_null() for c in _TUNING))
    )
    if profiler.is_empty() or records.is_empty():
        return pl.DataFrame(schema=COLUMNS)
    matched = []
    for (rank,), mine in profiler.group_by(["rank"], maintain_order=True):
        theirs = records.filter(pl.col("rank") == rank)
        for (group,), ops in mine.group_by(["process_group"], maintain_order=True):
            best = _best_communicator(ops, theirs)
            if best is not None:
                communicator, offset = best
                matched.append(_joined(ops, theirs.filter(pl.col("process_group") == communicator), offset))
    if not matched:
        return pl.DataFrame(schema=COLUMNS)
    return pl.concat(matched).select(*(pl.col(n).cast(t) for n, t in COLUMNS.items())).sort("rank", "process_group",
                                                                                           "seq")


_Op = tuple[str, int | None]  # (operation, elements per rank when known)
#: Operations of a process group used to find candidate offsets (each is then checked on the whole overlap).
PROBE = 64


def _sequence(frame: pl.DataFrame) -> dict[int, _Op]:
    return {
        seq: (operation(name), count)
        for seq, name, count in zip(frame["seq"].to_list(), frame["collective"].to_list(), frame["in_nelems"].to_list())
    }


def _same(a: _Op, b: _Op) -> bool:
    """The same operation, and the same size where both sides know it."""
    return a[0] == b[0] and (a[1] is None or b[1] is None or a[1] == b[1])


def _best_offset(mine: dict[int, _Op], theirs: dict[int, _Op]) -> tuple[int, int] | None:
    """The seq offset under which the most operations agree (and most of the overlap does), with that count."""
    by_operation: dict[str, list[int]] = {}
    for seq, op in theirs.items():
        by_operation.setdefault(op[0], []).append(seq)
    probe = sorted(mine)[:PROBE]
    offsets = Counter(t - m for m in probe for t in by_operation.get(mine[m][0], ()) if _same(mine[m], theirs[t]))
    for offset, _ in offsets.most_common(3):
        overlap = [m for m in mine if m + offset in theirs]
        agreeing = sum(1 for m in overlap if _same(mine[m], theirs[m + offset]))
        if agreeing >= MIN_AGREEING and agreeing >= MIN_AGREEMENT * len(overlap):
            return offset, agreeing
    return None


def _best_communicator(ops: pl.DataFrame, records: pl.DataFrame) -> tuple[str, int] | None:
    """The communicator (and seq offset) whose operations line up with ``ops``, or None."""
    mine = _sequence(ops)
    names = {str(v) for v in ops.select("process_group", "process_group_desc").row(0) if v is not None}
    candidates = []
    for (communicator,), theirs_frame in records.group_by(["process_group"], maintain_order=True):
        found = _best_offset(mine, _sequence(theirs_frame))
        if found is None:
            continue
        offset, agreeing = found
        labels = {str(communicator), *(str(v) for v in theirs_frame["process_group_desc"].unique().to_list() if v)}
        candidates.append((bool(names & labels), agreeing, -abs(offset), str(communicator), offset))
    if not candidates:
        return None
    _, _, _, communicator, offset = max(candidates)
    return communicator, offset


def _joined(ops: pl.DataFrame, records: pl.DataFrame, offset: int) -> pl.DataFrame:
    theirs = records.select(
        (pl.col("seq") - offset).alias("seq"), pl.col("collective").alias("nccl_collective"),
        pl.col("in_nelems").alias("nccl_nelems"), pl.col("trace_id").alias("nccl_trace_id"),
        pl.col("process_group").alias("communicator"), pl.col("seq").alias("nccl_seq"), *_TUNING,
    ).unique("seq", keep="first")
    joined = ops.drop(*_TUNING).join(theirs, on="seq", how="inner")
    agree = [
        _same((operation(a), n), (operation(b), m))
        for a, n, b, m in zip(joined["collective"].to_list(), joined["in_nelems"].to_list(),
                              joined["nccl_collective"].to_list(), joined["nccl_nelems"].to_list())
    ]
    return joined.filter(pl.Series(agree, dtype=pl.Boolean))
