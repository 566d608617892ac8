"""Every init/topology line shape of an NCCL debug log since 2.4 (docs/formats.md, NCCL debug log) is read:
a log of only that shape parses, every line recognised, and what it says lands in its table."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pyarrow.parquet as pq
import pytest

from tracelake.ingest import ParseOptions, TraceInfo, nccl_log
from tracelake.sample_traces import generate_nccl

SHAPES = generate_nccl.debug_log_shapes()


def _parse(tmp_path: Path, shape: str) -> tuple[TraceInfo, dict[str, pl.DataFrame]]:
    path = tmp_path / f"{shape}.log"
    path.write_text("\n".join(SHAPES[shape]) + "\n", encoding="utf-8")
    staging = tmp_path / f"staging-{shape}"
    staging.mkdir()
    info = nccl_log.parse(path, staging, ParseOptions(source_name=path.name, trace_id="0123456789abcdef0123"))
    frames = {}
    for table in ("communicators", "comm_channels"):
        frame = pl.from_arrow(pq.read_table(staging / f"{table}.parquet"))
        assert isinstance(frame, pl.DataFrame)
        frames[table] = frame
    return info, frames


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_every_line_of_a_shape_is_recognised(tmp_path: Path, shape: str) -> None:
    info, _ = _parse(tmp_path, shape)
    assert info.event_count == len(SHAPES[shape])
    assert not [w for w in info.warnings if w.startswith("recognised")]


@pytest.mark.parametrize("shape", ["init_2.4", "init_busid", "init_commid"])
def test_init_lines_with_and_without_bus_id(tmp_path: Path, shape: str) -> None:
    info, frames = _parse(tmp_path, shape)
    comms = frames["communicators"]
    assert comms["rank"].to_list() == [0, 1] and comms["cuda_dev"].to_list() == [0, 1]
    assert info.world_size == 2
    bus = comms["bus_id"].to_list() if "bus_id" in comms.columns else [None, None]
    assert bus == ([None, None] if shape == "init_2.4" else ["1b000", "2b000"])


def _channels(frames: dict[str, pl.DataFrame]) -> list[tuple[object, ...]]:
    return [tuple(row) for row in frames["comm_channels"].select(
        "rank", "channel", "src_rank", "dst_rank", "transport", "direction").iter_rows()]


def test_nccl_2_4_ring_lines_one_process_two_gpus(tmp_path: Path) -> None:
    _, frames = _parse(tmp_path, "ring_2.4")
    assert _channels(frames) == [(0, 0, 0, 1, "P2P/IPC", None), (1, 0, 1, 0, "P2P/IPC", None)]


def test_nccl_2_4_net_ring_lines_without_devices(tmp_path: Path) -> None:
    _, frames = _parse(tmp_path, "ring_net_2.4")
    assert _channels(frames) == [(0, 0, 1, 0, "NET/IB/0/GDRDMA", "receive"), (1, 0, 1, 0, "NET/IB/0/GDRDMA", "send")]


def test_channel_lines_naming_peers_by_bus_id(tmp_path: Path) -> None:
    _, frames = _parse(tmp_path, "channel_busid")
    assert _channels(frames) == [(0, 0, 1, 0, "NET/AWS Libfabric/0", "receive"),
                                 (1, 0, 1, 0, "NET/AWS Libfabric/0", "send")]
    _, frames = _parse(tmp_path, "channel_p2p_busid")
    assert _channels(frames) == [(0, 0, 0, 1, "P2P/direct pointer", None), (1, 0, 1, 0, "P2P/direct pointer", None)]


def test_transport_is_kept_whole(tmp_path: Path) -> None:
    _, frames = _parse(tmp_path, "channel_conn")
    assert _channels(frames) == [(0, 0, 0, 1, "P2P/direct pointer/read", None), (1, 0, 1, 0, "P2P/CUMEM/read", None)]


def test_version_line_with_and_without_prefix(tmp_path: Path) -> None:
    info, _ = _parse(tmp_path, "version")
    assert info.nccl_version == "2.4.8+cuda10.1"


def test_a_log_of_only_topology_lines_is_not_rejected(tmp_path: Path) -> None:
    path = tmp_path / "topology.log"
    lines = [line for shape in ("ring_order", "trees", "connected", "network", "init_start") for line in SHAPES[shape]]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    staging = tmp_path / "staging"
    staging.mkdir()
    info = nccl_log.parse(path, staging, ParseOptions(source_name=path.name, trace_id="0123456789abcdef0123"))
    assert info.event_count == len(lines)
