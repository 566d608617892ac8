"""NCCL figures: nccl-tests bandwidth per collective and message size, against what the links carry.

Pure functions over ``nccl_benchmarks`` rows (polars in, polars out). Bus bandwidth
follows docs/formats.md ("Bus bandwidth"); nccl-tests prints it already computed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from . import hardware

#: Family figures a job report draws when nothing better is known (docs/analyses.md, "Link peaks");
#: nccl-tests summaries use :mod:`tracelake.analysis.hardware` instead.
DEFAULT_LINK_PEAKS = {"nvlink": 450.0, "pcie": 50.0, "ib": 50.0, "socket": 12.5}
#: A benchmark peaking under this share of its link's bandwidth is reported.
LOW_SHARE = 0.7
#: Measured past this multiple of the chosen link's figure, the choice is wrong, not the link fast.
OVER_PEAK = 1.1

SUMMARY_COLUMNS = ("trace_id", "collective", "in_place", "ranks", "nodes", "sizes", "peak_busbw_gbs",
                   "peak_at_bytes", "half_peak_bytes", "small_time_us", "gpu", "link", "link_peak_gbs",
                   "peak_share_pct", "link_note")


def link_peaks(text: str | None) -> dict[str, float]:
    """``nvlink=450,ib_ndr=50`` -> the ``TRACELAKE_LINK_PEAKS`` overrides, by link name or family.

    Raises:
        ValueError: an entry that is not ``name=number``.
    """
    peaks: dict[str, float] = {}
    for item in filter(None, (part.strip() for part in (text or "").split(","))):
        name, _, value = item.partition("=")
        try:
            peaks[name.strip().lower()] = float(value)
        except ValueError:
            raise ValueError(f"link peak {item!r} is not name=GB/s (e.g. nvlink=450)") from None
    return peaks


def choose_link(nodes: int, model: str | None, transports: list[str],
                overrides: dict[str, float], nic_names: list[str] | tuple[str, ...] = ()
                ) -> tuple[str, float | None, str | None]:
    """The bottleneck link of an nccl-tests run, its figure, and why it is unknown (docs/analyses.md, "Link peaks").

    Across nodes the network NCCL used (``comm_channels.transport``), per rank: NICs seen x the
    NIC of the GPU's reference system, as RoCE when every device of NCCL's ``NET/IB : Using`` line
    (``nic_names``: ``mlx5_0:1/RoCE``) says so; within a node the GPU's NVLink/Infinity Fabric, or PCIe.
    Returns ``(link, GB/s or None, note or None)``; ``link`` is ``unknown`` when it cannot be told.
    """
    row = hardware.gpu(model)
    kinds = {_transport_kind(t) for t in transports}
    if nodes > 1:
        nics = {t.split("/")[2] for t in transports if _transport_kind(t) == "NET/IB" and len(t.split("/")) > 2}
        layers = {name.rsplit("/", 1)[-1] for name in nic_names if name.endswith(("/IB", "/RoCE"))}
        if "NET/IB" in kinds:
            nic = row.nic if row else None
            if nic and layers == {"RoCE"}:
                nic = hardware.ROCE_OF.get(nic, nic)
                if nic in overrides or "roce" in overrides:
                    return nic, overrides.get(nic, overrides.get("roce")), None
            if (nic and nic in overrides) or "ib" in overrides:  # the user said what a rank gets
                return nic or "ib", overrides[nic] if nic is not None and nic in overrides else overrides["ib"], None
            if nic is None:
                return "ib", None, f"link unknown: NET/IB, but no reference NIC for GPU {model or 'not named'}"
            if not nics:
                return nic, None, "link unknown: NET/IB, but the logs name no NIC, so their count per node is unknown"
            return nic, len(nics) * hardware.LINKS[nic][1], None
        if any("Libfabric" in k or "OFI" in k for k in kinds):
            efa = row.efa if row else None
            figure = hardware.peak(efa, overrides) if efa else overrides.get("efa")
            if figure is None:
                return "efa", None, f"link unknown: EFA, but no AWS instance known for GPU {model or 'not named'}"
            return efa or "efa", figure, None
        if "NET/Socket" in kinds:
            figure = overrides.get("socket")
            return "socket", figure, None if figure else \
                "link unknown: NET/Socket, the host NIC's speed is in no log (set TRACELAKE_LINK_PEAKS socket=GB/s)"
        return "unknown", None, (f"link unknown: {nodes} nodes, and no NCCL debug log of this job says which "
                                 "network (NET/IB, NET/Socket, EFA) carried the traffic")
    if row is None:
        return "unknown", None, f"link unknown: GPU {model!r} is not in the table" if model else \
            "link unknown: the output names no GPU"
    link = row.host_link if row.peer_link is None or ("SHM" in kinds and "P2P" not in kinds) else row.peer_link
    return link, hardware.peak(link, overrides), None


def _same_job(trace_id: str, traces: pl.DataFrame | None) -> list[str]:
    """The traces of ``trace_id``'s job (its run, where the traces say), itself first; only itself when unknown."""
    if traces is None or "job" not in traces.columns or traces.is_empty():
        return [trace_id]
    mine = traces.filter(pl.col("trace_id") == trace_id)
    if mine.is_empty():
        return [trace_id]
    same = traces.filter(pl.col("job") == mine["job"][0])
    if "run" in traces.columns and mine["run"][0] is not None:
        same = same.filter(pl.col("run") == mine["run"][0])
    return [trace_id, *(t for t in same["trace_id"].to_list() if t != trace_id)]


def _column_of(frame: pl.DataFrame | None, traces: list[str], column: str, *where: pl.Expr) -> list[str]:
    """``column``'s values in ``frame`` for the first of ``traces`` that has any (its own first, then its job's)."""
    if frame is None or frame.is_empty() or column not in frame.columns:
        return []
    for trace_id in traces:
        values = frame.filter(pl.col("trace_id") == trace_id, *where)[column].drop_nulls().to_list()
        if values:
            return [str(v) for v in values]
    return []


def _trace_links(summary: pl.DataFrame, peaks: dict[str, float], devices: pl.DataFrame | None,
                 traces: pl.DataFrame | None, channels: pl.DataFrame | None) -> pl.DataFrame:
    """Per trace of ``summary``: ``gpu``, ``link``, ``link_peak_gbs``, ``link_note``. An nccl-tests trace
    without NCCL lines of its own takes the transports and NICs of an NCCL log of the same job and run (the
    benchmark's ``NCCL_DEBUG`` output saved apart), never those of another job."""
    rows = []
    for trace_id, nodes in summary.select("trace_id", "nodes").unique("trace_id", maintain_order=True).iter_rows():
        models = set(_column_of(devices, [trace_id], "name", pl.col("kind") == "gpu"))
        if not models and traces is not None and "device_name" in traces.columns:
            models = set(_column_of(traces, [trace_id], "device_name"))
        related = _same_job(trace_id, traces)
        transports = _column_of(channels, related, "transport")
        nics = _column_of(devices, related, "name", pl.col("kind") == "nic")
        model: str | None = next(iter(models)) if len(models) == 1 else None
        link, figure, note = choose_link(nodes or 1, model, transports, peaks, nics) if len(models) <= 1 \
            else ("unknown", None, f"link unknown: mixed GPUs ({', '.join(sorted(models))})")
        rows.append({"trace_id": trace_id, "gpu": model, "link": link, "link_peak_gbs": figure, "link_note": note})
    return pl.DataFrame(rows, schema={"trace_id": summary.schema["trace_id"], "gpu": pl.String, "link": pl.String,
                                      "link_peak_gbs": pl.Float64, "link_note": pl.String})


def benchmark_summary(rows: pl.DataFrame, peaks: dict[str, float] | None = None, *,
                      devices: pl.DataFrame | None = None, traces: pl.DataFrame | None = None,
                      channels: pl.DataFrame | None = None) -> pl.DataFrame:
    """Per (trace, collective, placement): peak busbw and the size it is reached at, the smallest size
    reaching half of it, the time of the smallest message (latency), and the peak against the link's.

    The link follows :func:`choose_link` from the trace's GPU (``devices`` rows, else
    ``traces.device_name``) and the transports of ``channels``; ``peaks`` are the
    ``TRACELAKE_LINK_PEAKS`` overrides. No share is given when the link is unknown, or when
    the peak passes the link's figure by more than :data:`OVER_PEAK` (then the choice was wrong).
    """
    peaks = peaks or {}
    if rows.is_empty():
        return pl.DataFrame(schema={c: pl.String for c in SUMMARY_COLUMNS})
    keys = ["trace_id", "collective", "in_place", "ranks", "nodes"]  # runs of one file with other ranks apart
    ordered = rows.sort([*keys, "size_bytes"], nulls_last=True)
    summary = ordered.group_by(keys, maintain_order=True).agg(
        pl.len().alias("sizes"),
        pl.col("busbw_gbs").max().alias("peak_busbw_gbs"),
        pl.col("size_bytes").sort_by("busbw_gbs", "size_bytes").last().alias("peak_at_bytes"),
        pl.col("size_bytes").filter(pl.col("busbw_gbs") >= 0.5 * pl.col("busbw_gbs").max()).min()
        .alias("half_peak_bytes"),
        pl.col("time_us").filter(pl.col("size_bytes") > 0).first().alias("small_time_us"),  # 0 B rows time no data
    )
    links = _trace_links(summary, peaks, devices, traces, channels)
    over = pl.col("peak_busbw_gbs") > OVER_PEAK * pl.col("link_peak_gbs")
    wrong = (pl.lit("link unknown: ") + pl.col("peak_busbw_gbs").round(1).cast(pl.String)
             + pl.lit(" GB/s is over the ") + pl.col("link") + pl.lit(" figure of ")
             + pl.col("link_peak_gbs").round(1).cast(pl.String)
             + pl.lit(" GB/s, so that is not the bottleneck: the run may be within one node, or use more NICs"))
    return summary.join(links, on="trace_id", how="left").with_columns(
        pl.when(over).then(wrong).otherwise(pl.col("link_note")).alias("link_note"),
        pl.when(over).then(None).otherwise(100 * pl.col("peak_busbw_gbs") / pl.col("link_peak_gbs"))
        .alias("peak_share_pct"),
    ).select(SUMMARY_COLUMNS)


def lagging_ranks(status: pl.DataFrame) -> pl.DataFrame:
    """From Flight Recorder status: per process group, the ranks whose last completed collective is behind
    the furthest any rank enqueued (hung in, or late to, the next one). Columns: ``process_group``, ``rank``,
    ``last_completed``, ``group_enqueued`` (the furthest enqueued seq in the group), ``behind``."""
    if status.is_empty():
        return pl.DataFrame(schema={"process_group": pl.String, "rank": pl.Int32, "last_completed": pl.Int64,
                                    "group_enqueued": pl.Int64, "behind": pl.Int64})
    return (
        status.with_columns(pl.col("last_enqueued").max().over("process_group").alias("group_enqueued"))
        .with_columns((pl.col("group_enqueued") - pl.col("last_completed").fill_null(0)).alias("behind"))
        .filter(pl.col("behind") > 0)
        .select("process_group", "rank", "last_completed", "group_enqueued", "behind")
        .sort("behind", "rank", descending=[True, False])
    )


#: Formats whose collectives cover a whole run (NCCL's own records), unlike a profiler's window.
NCCL_RECORD_FORMATS = ("nccl_log", "nccl_inspector", "nccl_profiler")
_POINT_TO_POINT = ("send", "recv")


def unreached(collectives: pl.DataFrame, traces: pl.DataFrame) -> pl.DataFrame:
    """From NCCL's own records (Inspector ``coll_sn``, debug log ``opCount``, profiler plugin ``SeqNum``):
    per communicator, the ranks whose records stop before the furthest collective another rank reached.

    A rank that never reached the last collective is hung, crashed, or its records were cut
    short. Point-to-point operations are left out (each pair numbers its own).
    Columns: ``process_group``, ``rank``, ``last_seq``, ``group_last_seq``, ``behind``,
    ``group_size``, ``ranks_seen``.
    """
    columns = {"process_group": pl.String, "rank": pl.Int32, "last_seq": pl.Int64, "group_last_seq": pl.Int64,
               "behind": pl.Int64, "group_size": pl.Int32, "ranks_seen": pl.UInt32}
    if collectives.is_empty() or traces.is_empty():
        return pl.DataFrame(schema=columns)
    sources = traces.filter(pl.col("format").is_in(NCCL_RECORD_FORMATS)).select("trace_id")
    records = collectives.join(sources, on="trace_id").filter(
        pl.col("seq").is_not_null() & pl.col("process_group").is_not_null() & pl.col("rank").is_not_null()
        & ~pl.col("collective").is_in(_POINT_TO_POINT)
    )
    if records.is_empty():
        return pl.DataFrame(schema=columns)
    per_rank = records.group_by("process_group", "rank").agg(
        pl.col("seq").max().alias("last_seq"), pl.col("group_size").max()
    )
    return (
        per_rank.with_columns(
            pl.col("last_seq").max().over("process_group").alias("group_last_seq"),
            pl.col("rank").n_unique().over("process_group").alias("ranks_seen"),
            pl.col("group_size").max().over("process_group"),
        )
        .with_columns((pl.col("group_last_seq") - pl.col("last_seq")).alias("behind"))
        .filter((pl.col("behind") > 0) & (pl.col("ranks_seen") > 1))
        .select(*(pl.col(name).cast(dtype) for name, dtype in columns.items()))
        .sort("behind", "process_group", "rank", descending=[True, False, False])
    )


def _transport_kind(transport: str) -> str:
    """``P2P``, ``SHM``, ``NET/IB``, ``NET/Socket`` (GDRDMA and channel suffixes dropped)."""
    parts = transport.split("/")
    if parts[0] == "NET" and len(parts) > 1:
        return f"NET/{parts[1]}"
    return parts[0]


def topology(communicators: pl.DataFrame, channels: pl.DataFrame, devices: pl.DataFrame | None = None) -> pl.DataFrame:
    """Per trace: nodes, GPUs per node, ranks, channels, the transports used, the network devices NCCL named
    (``nics``, from ``devices`` rows of kind ``nic``) and the surprises among them.

    Surprises: a ``NET/Socket`` connection where ``NET/IB`` also appears (a NIC or HCA
    not used), ``NET/Socket`` only across several nodes (no InfiniBand at all), ``SHM``
    between GPUs of one node (peer-to-peer disabled or unavailable).
    """
    columns = {"trace_id": pl.String, "nodes": pl.Int64, "gpus_per_node": pl.Int64, "ranks": pl.Int64,
               "channels": pl.Int64, "transports": pl.String, "nics": pl.String, "surprises": pl.String}
    if communicators.is_empty():
        return pl.DataFrame(schema=columns)
    rows = []
    for (trace_id,), comms in communicators.group_by(["trace_id"], maintain_order=True):
        mine = channels.filter(pl.col("trace_id") == trace_id) if channels.height else channels
        kinds = sorted({_transport_kind(t) for t in mine["transport"].to_list()}) if mine.height else []
        gdr = mine.height and any("GDRDMA" in t for t in mine["transport"].to_list())
        nodes = _max_int(comms, "nodes") or len(set(comms["host"].to_list()))
        surprises = []
        if "NET/Socket" in kinds and "NET/IB" in kinds:
            surprises.append("NET/Socket connections beside NET/IB: some traffic misses the InfiniBand NICs")
        elif "NET/Socket" in kinds and nodes > 1:
            surprises.append("across nodes only over NET/Socket: no InfiniBand/RoCE in use")
        if "SHM" in kinds:
            surprises.append("SHM between GPUs of a node: peer-to-peer (NVLink/PCIe P2P) disabled or unavailable")
        if "NET/IB" in kinds and not gdr:
            surprises.append("NET/IB without GPUDirect RDMA: network traffic is staged through host memory")
        rows.append({
            "trace_id": str(trace_id), "nodes": nodes,
            "gpus_per_node": _max_int(comms, "local_ranks"),
            "ranks": _max_int(comms, "nranks") or 0, "channels": mine["channel"].n_unique() if mine.height else 0,
            "transports": ", ".join(kinds) or None,
            "nics": ", ".join(_column_of(devices, [str(trace_id)], "name", pl.col("kind") == "nic")) or None,
            "surprises": "; ".join(surprises) or None,
        })
    return pl.DataFrame(rows, schema=columns)


def _max_int(frame: pl.DataFrame, column: str) -> int | None:
    if column not in frame.columns:
        return None
    value = frame[column].max()
    return int(value) if isinstance(value, int | float) else None


@dataclass(frozen=True)
class Curve:
    """nccl-tests bus bandwidth of one collective against message size (sizes ascending, bytes; GB/s)."""

    sizes: np.ndarray
    busbw_gbs: np.ndarray

    def at(self, size: int) -> float:
        """Bus bandwidth at ``size`` bytes: linear in log2 of the size between measured sizes, the nearest
        measured figure outside them."""
        return float(np.interp(np.log2(max(size, 1)), np.log2(self.sizes), self.busbw_gbs))


def bandwidth_curves(benchmarks: pl.DataFrame) -> dict[str, Curve]:
    """Per nccl-tests collective, its bus bandwidth by message size (docs/analyses.md, "Critical path"):
    out-of-place runs where a size has them, the median over the runs of each size; sizes with no positive
    bandwidth are left out."""
    if benchmarks.is_empty():
        return {}
    rows = benchmarks.filter((pl.col("busbw_gbs") > 0) & (pl.col("size_bytes") > 0)).with_columns(
        pl.col("in_place").fill_null(False))
    out_of_place = rows.group_by("collective", "size_bytes").agg((~pl.col("in_place")).any().alias("has_oop"))
    rows = rows.join(out_of_place, on=["collective", "size_bytes"]).filter(~pl.col("has_oop") | ~pl.col("in_place"))
    points = rows.group_by("collective", "size_bytes").agg(pl.col("busbw_gbs").median()).sort("collective",
                                                                                             "size_bytes")
    return {str(name): Curve(part["size_bytes"].to_numpy().astype(np.float64), part["busbw_gbs"].to_numpy())
            for (name,), part in points.group_by("collective", maintain_order=True)}
