"""XLA allocator events (``MemoryAllocation`` / ``MemoryDeallocation`` on host planes) into ``memory_events``.

XLA's allocators (the BFC allocator of the GPU and CPU clients, the TPU runtime's) record one zero-length
event per allocation and per free on the thread that made it, on a ``/host:...`` plane, with the stats
XProf's memory profile reads (docs/formats.md, "XLA allocator events"): which allocator (``allocator_name``
such as ``GPU_0_bfc``, or ``index_on_host`` / ``device_ordinal``), the allocator's figures after the
event (``bytes_allocated``, ``bytes_reserved``, ``bytes_available``, ``peak_bytes_in_use``) and the
block (``addr``, ``allocation_bytes``, ``requested_bytes``, ``tf_op``, ``shape``...).

:class:`MemoryRows` collects them while :mod:`.xla_host` reads the host lines (both its bulk and its
one-event-at-a-time path hand it each event's stats by name, so the two give the same rows), and writes
the table once the devices and steps are known (:meth:`MemoryRows.write`). The rows follow the table's
meaning for Kineto: ``total_allocated`` is what the allocator has in use (``bytes_allocated`` plus the
``bytes_reserved`` stack, XProf's peak measure), ``total_reserved`` the same (XLA's allocators report no
cache apart from their preallocated pool), ``bytes`` the block's ``allocation_bytes``, negative for a free.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from .tables import fit_int, write_table
from .xla_rows import Steps, as_int, as_str
from .xspace import Plane
from .xspace_stats import BatchStats

#: The host event names of allocator events (XProf's ``HostEventType`` ``kMemoryAllocation``,
#: ``kMemoryDeallocation``) and the ``memory_events.kind`` each becomes.
EVENT_KINDS = {"MemoryAllocation": "alloc", "MemoryDeallocation": "free"}
#: The stats read, as XProf's memory profile reads them (``tf_op`` names the op that allocated).
STATS = ("allocator_name", "index_on_host", "device_ordinal", "bytes_allocated", "bytes_reserved", "bytes_available",
         "allocation_bytes", "addr", "tf_op")
#: The device allocators of XLA's GPU client: ``GPU_<ordinal>_bfc``. Other names (``xla_gpu_host_bfc``, pinned host
#: memory; ``cpu``...) are host allocators: not stored (:meth:`MemoryRows.write` warns with their names).
_GPU_ALLOCATOR = re.compile(r"^GPU_(\d+)_bfc$")

_COLUMNS = ("event_id", "rank", "pid", "tid", "device", "device_type", "ts_ns", "kind", "addr", "bytes",
            "total_allocated", "total_reserved", "op", "step")


class MemoryRows:
    """The allocator events of one XSpace, collected line by line and written as ``memory_events``."""

    def __init__(self) -> None:
        #: One tuple per event: (event_id, pid, tid, ts_ns, kind, stats by name).
        self._events: list[tuple[int, int | None, int, int, str, dict[str, object]]] = []
        self._kinds: dict[int, dict[int, str]] = {}

    def __len__(self) -> int:
        return len(self._events)

    def kinds(self, plane: Plane) -> dict[int, str]:
        """The plane's event metadata ids of allocator events, each with its kind (cached per plane)."""
        found = self._kinds.get(plane.position)
        if found is None:
            found = {int(i): EVENT_KINDS[str(md.name)] for i, md in plane.header.event_metadata.items()
                     if str(md.name) in EVENT_KINDS}
            self._kinds[plane.position] = found
        return found

    def add(self, kind: str, event_id: int, ts_ns: int, pid: int | None, tid: int, stats: Mapping[str, object]) -> None:
        """One allocator event with its stats by name (:meth:`.xspace.Plane.named_stats`' values)."""
        self._events.append((event_id, pid, tid, ts_ns, kind, {k: stats[k] for k in STATS if k in stats}))

    def add_batch(self, plane: Plane, stats: BatchStats, metadata_ids: np.ndarray, order: np.ndarray, ts: np.ndarray,
                  first_id: int, pid: int | None, tid: int) -> None:
        """The allocator events of a unit of a line decoded in bulk (:meth:`.xla_host.HostLines.host_columns`).

        ``metadata_ids``, ``ts`` and the event ids (``first_id`` on) are in sorted order; ``order[i]`` is the
        sorted event ``i``'s index in ``stats``. Values are decoded as :func:`.xspace.stat_value` decodes them.
        """
        kinds = self.kinds(plane)
        if not kinds:
            return
        chosen = np.flatnonzero(np.isin(metadata_ids, np.fromiter(kinds, dtype=np.int64)))
        if not len(chosen):
            return
        by_name: dict[str, tuple[list[object], np.ndarray]] = {
            name: stats.values(stats.last(name)[order[chosen]]) for name in STATS}
        for j, i in enumerate(chosen.tolist()):
            named = {name: objects[codes[j]] for name, (objects, codes) in by_name.items() if codes[j] >= 0}
            self._events.append((first_id + i, pid, tid, int(ts[i]), kinds[int(metadata_ids[i])], named))

    def write(self, staging: Path, trace_id: str, devices: dict[int, dict[str, object]], steps: Steps,
              rank_offset: int) -> list[str]:
        """Write ``memory_events`` (nothing without events); fill the capacity of devices that lack one.

        A device allocator's events go to the rank of its device (its index plus ``rank_offset``, as the
        device planes' ranks). A device without ``memory_size`` on its plane (TPU) gets the allocator's own
        capacity, the largest ``bytes_allocated + bytes_reserved + bytes_available`` (XProf's "memory
        capacity"). A free without ``allocation_bytes`` (the TPU runtime's) takes the size of the block
        allocated last at its address by the same allocator before it. Returns warnings.
        """
        if not self._events:
            return []
        data: dict[str, list[object]] = {c: [] for c in _COLUMNS}
        host_allocators: dict[str, int] = {}
        live: dict[tuple[int, int], int] = {}  # (rank, addr) -> bytes of the block allocated there last
        limits: dict[int, int] = {}
        for event_id, pid, tid, ts, kind, stats in sorted(self._events, key=lambda e: (e[3], e[0])):
            index = _device_index(stats)
            if index is None:
                name = as_str(stats.get("allocator_name")) or "(unnamed)"
                host_allocators[name] = host_allocators.get(name, 0) + 1
                continue
            rank = index + rank_offset
            size = as_int(stats.get("allocation_bytes"))
            addr = fit_int(as_int(stats.get("addr")))
            if kind == "alloc":
                if addr is not None and size is not None:
                    live[(rank, addr)] = size
            elif addr is not None:
                known = live.pop((rank, addr), None)
                size = known if size is None else size
            heap, stack = as_int(stats.get("bytes_allocated")), as_int(stats.get("bytes_reserved")) or 0
            in_use = heap + stack if heap is not None else None
            free = as_int(stats.get("bytes_available"))
            if in_use is not None and free is not None:
                limits[rank] = max(limits.get(rank, 0), in_use + free)
            device = devices.get(rank, {})
            for column, value in (
                ("event_id", event_id), ("rank", rank), ("pid", pid), ("tid", tid), ("device", index),
                ("device_type", _device_type(device, stats)), ("ts_ns", ts), ("kind", kind), ("addr", addr),
                ("bytes", None if size is None else (size if kind == "alloc" else -size)),
                ("total_allocated", in_use), ("total_reserved", in_use), ("op", as_str(stats.get("tf_op"))),
                ("step", steps.step_at(rank, ts)),
            ):
                data[column].append(value)
        for rank, limit in limits.items():
            if rank in devices and devices[rank].get("memory_bytes") is None and limit > 0:
                devices[rank]["memory_bytes"] = limit
        if data["event_id"]:
            write_table(staging, "memory_events", data, trace_id=trace_id)
        if not host_allocators:
            return []
        named = ", ".join(f"{name} ({n})" for name, n in sorted(host_allocators.items())[:5])
        return [f"allocator events of host allocators not stored (memory_events holds device memory): {named}"]


def _device_index(stats: Mapping[str, object]) -> int | None:
    """The device an allocator event belongs to: ``GPU_<n>_bfc``'s n, else ``index_on_host`` or ``device_ordinal``;
    None for a host allocator (or an index that is not a device's)."""
    name = as_str(stats.get("allocator_name"))
    if name is not None:
        match = _GPU_ALLOCATOR.match(name)
        return fit_int(int(match.group(1)), 31) if match else None
    for key in ("index_on_host", "device_ordinal"):
        index = fit_int(as_int(stats.get(key)), 31)
        if index is not None and index >= 0:
            return index
    return None


def _device_type(device: Mapping[str, object], stats: Mapping[str, object]) -> str | None:
    """``tpu``, ``cuda`` or ``hip`` (by the device plane's kind and vendor), as Kineto's device types are named."""
    kind = device.get("kind")
    if kind == "tpu":
        return "tpu"
    if kind == "gpu" or as_str(stats.get("allocator_name")):
        return "hip" if str(device.get("vendor") or "").lower() == "amd" else "cuda"
    return None
