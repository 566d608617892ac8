"""Collectives across ranks: arrival skew, the last rank, transfer time and bandwidth.

A collective instance is (process group, seq) within a job, a send/recv the pair's (process group, source,
destination, seq) (docs/analyses.md, "Collectives across ranks"). Its
transfer time is estimated as the shortest duration over ranks (the others also
waited for the last arrival); algbw = bytes / time and busbw = algbw x the
collective's factor for n ranks, with bytes and factors from docs/formats.md (the
``message_bytes`` column already holds the nccl-tests size of the operation).

The functions take rows of the ``collectives`` table (at least ``process_group``,
``seq``, ``collective``, ``rank``, ``ts_ns``, ``dur_ns``, ``message_bytes``).
"""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl

from tracelake.contracts.critical import P2P_OPS

#: Bus bandwidth factor by collective name (lower case): ``a * (n - 1) / n + b`` as ``(a, b)``.
BUSBW_FACTORS: dict[str, tuple[float, float]] = {
    **dict.fromkeys(("allreduce", "all_reduce"), (2.0, 0.0)),
    **dict.fromkeys((
        "allgather", "_allgather_base", "all_gather", "all_gather_into_tensor", "allgather_into_tensor_coalesced",
        "reduce_scatter", "_reduce_scatter_base", "reduce_scatter_tensor", "reduce_scatter_tensor_coalesced",
        "all_to_all", "all_to_allv", "alltoall_base", "gather", "scatter",
    ), (1.0, 0.0)),
    **dict.fromkeys(("broadcast", "reduce", "send", "recv", "send/recv"), (0.0, 1.0)),
}
#: The nccl-tests benchmark (``nccl_benchmarks.collective``) that measures each collective (lower case).
NCCL_TESTS_NAMES: dict[str, str] = {
    **dict.fromkeys(("allreduce", "all_reduce"), "all_reduce"),
    **dict.fromkeys(("allgather", "_allgather_base", "all_gather", "all_gather_into_tensor",
                     "allgather_into_tensor_coalesced"), "all_gather"),
    **dict.fromkeys(("reduce_scatter", "_reduce_scatter_base", "reduce_scatter_tensor",
                     "reduce_scatter_tensor_coalesced"), "reduce_scatter"),
    **dict.fromkeys(("all_to_all", "all_to_allv", "alltoall", "alltoall_base"), "alltoall"),
    "broadcast": "broadcast", "reduce": "reduce", "gather": "gather", "scatter": "scatter",
    **dict.fromkeys(("send", "recv", "send/recv"), "sendrecv"),
}

COLUMNS = (
    "process_group", "seq", "collective", "ranks", "message_bytes", "first_ns", "skew_ns", "last_rank",
    "transfer_ns", "algbw_gbs", "busbw_gbs",
)
_INSTANCE = ("process_group", "seq")


def busbw_factor(collective: pl.Expr, n: pl.Expr) -> pl.Expr:
    """The bus bandwidth factor of ``collective`` (a name) over ``n`` ranks; null for unknown collectives."""
    name = collective.str.to_lowercase()
    a = name.replace_strict({k: v[0] for k, v in BUSBW_FACTORS.items()}, default=None, return_dtype=pl.Float64)
    b = name.replace_strict({k: v[1] for k, v in BUSBW_FACTORS.items()}, default=None, return_dtype=pl.Float64)
    return a * (n - 1) / n + b


def _timed(collectives: pl.DataFrame) -> pl.DataFrame:
    """Rows with a ``seq`` and a start; a send/recv's group named with its pair (``0:1->2``), whose ``seq`` it counts."""
    timed = collectives.filter(pl.col("seq").is_not_null() & pl.col("ts_ns").is_not_null())
    if "src_rank" not in timed.columns or "dst_rank" not in timed.columns:
        return timed
    pair = (pl.col("collective").str.to_lowercase().is_in(P2P_OPS) & pl.col("src_rank").is_not_null()
            & pl.col("dst_rank").is_not_null())
    return timed.with_columns(pl.when(pair).then(pl.format("{}:{}->{}", pl.col("process_group"), pl.col("src_rank"),
                                                           pl.col("dst_rank")))
                              .otherwise(pl.col("process_group")).alias("process_group"))


def instances(collectives: pl.DataFrame, by: Sequence[str] = ()) -> pl.DataFrame:
    """One row per collective instance seen on more than one rank, in time order.

    ``by`` names columns that separate instances further (``("job",)`` over a fleet's
    rows: each job has its own process groups); they lead the output columns.
    """
    ts = pl.col("ts_ns")
    inst = (
        _timed(collectives)
        .group_by(*by, *_INSTANCE)
        .agg(
            pl.col("collective").first(),
            pl.col("rank").n_unique().cast(pl.Int64).alias("ranks"),
            pl.col("message_bytes").max(),
            ts.min().alias("first_ns"),
            (ts.max() - ts.min()).alias("skew_ns"),
            pl.col("rank").sort_by(ts, "rank").last().alias("last_rank"),
            pl.col("dur_ns").min().alias("transfer_ns"),
        )
        .filter(pl.col("ranks") > 1)
    )
    transfer = pl.col("transfer_ns")
    algbw = pl.when(transfer > 0).then(pl.col("message_bytes") / transfer)
    return (
        inst.with_columns(algbw.alias("algbw_gbs"))
        .with_columns(
            (pl.col("algbw_gbs") * busbw_factor(pl.col("collective"), pl.col("ranks"))).alias("busbw_gbs")
        )
        .sort("first_ns", *by, "process_group", "seq")
        .select(*by, *COLUMNS)
    )


def last_arrivals(collectives: pl.DataFrame, by: Sequence[str] = ()) -> pl.DataFrame:
    """How often each rank is the last to start a collective (by process group and seq).

    The last rank to arrive makes every other rank wait inside the collective.
    Columns: ``rank``, ``times_last``, ``collectives`` (instances seen on more than
    one rank), ``mean_skew_us`` (mean of last - first arrival over the instances
    the rank was last at). With ``by`` (e.g. ``("job",)``), instances and counts are
    per value of those columns, which lead the output columns.
    """
    ts = pl.col("ts_ns")
    key = (*by, *_INSTANCE)
    # a recv posted before its send is not waiting for a straggler: only collectives count
    c = _timed(collectives).filter(~pl.col("collective").str.to_lowercase().is_in(P2P_OPS))
    # one arrival per rank and instance (a rank's trace, Flight Recorder dump and NCCL log may each hold it)
    c = c.group_by(*by, "rank", *_INSTANCE).agg(ts.min()).with_columns(
        ts.max().over(key).alias("last_ns"),
        ts.min().over(key).alias("first_ns"),
        pl.len().over(key).alias("rows"),
    ).filter(pl.col("rows") > 1)
    if by:
        totals = c.group_by(*by).agg(pl.struct(_INSTANCE).n_unique().cast(pl.Int64).alias("collectives"))
    else:
        total = c.select(pl.struct(_INSTANCE).n_unique()).item() if c.height else 0
    late = (
        # An instance where every rank arrived at once has no last rank.
        c.filter((ts == pl.col("last_ns")) & (pl.col("last_ns") > pl.col("first_ns")))
        .group_by(*by, "rank")
        .agg(
            pl.len().cast(pl.Int64).alias("times_last"),
            ((pl.col("last_ns") - pl.col("first_ns")).mean() / 1e3).round(1).alias("mean_skew_us"),
        )
    )
    late = late.join(totals, on=list(by), how="left") if by else late.with_columns(
        pl.lit(total, dtype=pl.Int64).alias("collectives"))
    return (
        late.sort([*by, "times_last", "rank"], descending=[False] * len(by) + [True, False])
        .select(*by, "rank", "times_last", "collectives", "mean_skew_us")
    )


def lateness(collectives: pl.DataFrame) -> pl.DataFrame:
    """How late each rank starts each collective instance seen on more than one rank.

    Columns: ``process_group``, ``seq``, ``collective``, ``first_ns`` (first arrival),
    ``rank``, ``lateness_ns`` (its start - the first arrival; 0 for the first rank);
    instances in time order, ranks in order. The input of a rank x collective heat map.
    """
    ts = pl.col("ts_ns")
    rows = _timed(collectives).select(*_INSTANCE, "collective", "rank", "ts_ns").with_columns(
        ts.min().over(_INSTANCE).alias("first_ns"),
        pl.col("rank").n_unique().over(_INSTANCE).alias("ranks"),
    ).filter(pl.col("ranks") > 1)
    return (
        rows.group_by(*_INSTANCE, "rank")
        .agg(pl.col("collective").first(), pl.col("first_ns").first(), (ts.min() - pl.col("first_ns").first())
             .alias("lateness_ns"))
        .sort("first_ns", "process_group", "seq", "rank")
        .select(*_INSTANCE, "collective", "first_ns", "rank", "lateness_ns")
    )


def _size_bucket(size: pl.Expr) -> pl.Expr:
    """Power-of-4 message-size buckets, labelled by their lower bound (``1 MiB``, ``4 MiB``, ...)."""
    exponent = (size.cast(pl.Float64).log(4).floor() * 2).cast(pl.Int64)
    lower = pl.lit(2, dtype=pl.Int64).pow(exponent)
    units = [(40, "TiB"), (30, "GiB"), (20, "MiB"), (10, "KiB"), (0, "B")]
    label = pl.lit(None, dtype=pl.String)
    for shift, unit in reversed(units):
        label = pl.when(exponent >= shift).then(
            (lower // (1 << shift)).cast(pl.String) + pl.lit(f" {unit}")).otherwise(label)
    return label


def bandwidth_by_size(instances_frame: pl.DataFrame) -> pl.DataFrame:
    """Bus bandwidth per collective and message-size bucket (powers of 4), from :func:`instances` rows.

    Columns: ``collective``, ``bucket`` (lower bound), ``bucket_bytes``, ``instances``, ``median_busbw_gbs``,
    ``min_busbw_gbs``, ``total_transfer_ns``; largest buckets last.
    """
    timed = instances_frame.filter(pl.col("busbw_gbs").is_not_null() & (pl.col("message_bytes") > 0))
    if timed.is_empty():
        return pl.DataFrame(schema={"collective": pl.String, "bucket": pl.String, "bucket_bytes": pl.Int64,
                                    "instances": pl.Int64, "median_busbw_gbs": pl.Float64,
                                    "min_busbw_gbs": pl.Float64, "total_transfer_ns": pl.Int64})
    exponent = (pl.col("message_bytes").cast(pl.Float64).log(4).floor() * 2).cast(pl.Int64)
    return (
        timed.with_columns(_size_bucket(pl.col("message_bytes")).alias("bucket"),
                           pl.lit(2, dtype=pl.Int64).pow(exponent).alias("bucket_bytes"))
        .group_by("collective", "bucket", "bucket_bytes")
        .agg(pl.len().cast(pl.Int64).alias("instances"), pl.col("busbw_gbs").median().alias("median_busbw_gbs"),
             pl.col("busbw_gbs").min().alias("min_busbw_gbs"),
             pl.col("transfer_ns").sum().cast(pl.Int64).alias("total_transfer_ns"))
        .sort("collective", "bucket_bytes")
    )


def slowest(instances_frame: pl.DataFrame, top: int = 5) -> pl.DataFrame:
    """The collective instances that took longest (transfer time), with their group, size and bandwidth."""
    return instances_frame.filter(pl.col("transfer_ns").is_not_null()).sort(
        "transfer_ns", descending=True).head(top)
