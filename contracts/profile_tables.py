"""The declarations of the tables from PyTorch's memory data (Kineto memory instants, the memory timeline export,
allocator snapshots) and execution traces. Use them through :mod:`tracelake.contracts.schema`.
"""

from __future__ import annotations

from .columns import EVENT_ID, JOB, RANK, STEP, TRACE_ID, TS, Table
from .columns import column as _c

MEMORY_EVENTS = Table(
    "memory_events",
    "Allocator events of a profile with `profile_memory=True`: one row per Kineto `[memory]` instant (an "
    "allocation or a free) or `[OutOfMemory]` instant (a failed allocation).",
    (
        TRACE_ID,
        EVENT_ID,
        RANK,
        _c("pid", "BIGINT", "Process id."),
        _c("tid", "BIGINT", "Thread id of the allocating (or freeing) thread."),
        _c("device", "INTEGER", "Device index (Kineto's `Device Id`); -1 for the CPU."),
        _c("device_type", "VARCHAR", "`cpu`, `cuda`, `hip`, `xpu`, `mtia`, ...: Kineto's numeric `Device Type` "
           "(PyTorch's `c10::DeviceType`, docs/formats.md); null for a number not known."),
        TS,
        _c("kind", "VARCHAR", "`alloc` (bytes > 0), `free` (bytes < 0) or `oom` (`[OutOfMemory]`: the "
           "allocation of `bytes` that failed); null for a `[memory]` event of 0 or unreadable bytes."),
        _c("addr", "BIGINT", "Address of the block allocated or freed; null for `oom` and where not given."),
        _c("bytes", "BIGINT", "Bytes allocated (positive) or freed (negative), as the trace gives them."),
        _c("total_allocated", "BIGINT", "Bytes allocated on the device after the event (the allocator's running "
           "total)."),
        _c("total_reserved", "BIGINT", "Bytes the allocator reserved on the device after the event (held from the "
           "driver, allocated or cached)."),
        _c("op", "VARCHAR", "Name of the innermost `cpu_op` on the same thread running at `ts_ns` (start <= "
           "`ts_ns` < end, or `ts_ns` = start for an op of zero length); null outside any."),
        STEP,
    ),
    (JOB,),
)

MEMORY_TIMELINE = Table(
    "memory_timeline",
    "The PyTorch profiler's memory timeline export (`export_memory_timeline` to `*raw.json.gz`): one row per "
    "event of one device's tensor memory, with its category. The running sum of `bytes` (per category) is the "
    "memory live at each time.",
    (
        TRACE_ID,
        EVENT_ID,
        RANK,
        _c("device", "INTEGER", "Device index; null: the export does not say which device it was made for."),
        _c("ts_ns", "BIGINT", "Time, ns since the epoch; null for memory that existed before profiling began "
                              "(`preexisting`, time -1 in the file)."),
        _c("action", "VARCHAR", "`preexisting`, `create`, `increment_version` (an in-place update: a negative row "
                                "for the old version and a positive one for the new) or `destroy`."),
        _c("bytes", "BIGINT", "Bytes, signed: positive when memory becomes live, negative when it is given back."),
        _c("category", "VARCHAR", "`parameter`, `optimizer_state`, `input`, `temporary`, `activation`, `gradient`, "
                                  "`autograd_detail`; null where the profiler could not tell."),
    ),
    (JOB,),
)

ALLOCATOR_SEGMENTS = Table(
    "allocator_segments",
    "PyTorch CUDA caching allocator snapshots (`torch.cuda.memory._snapshot()`): one row per block of each "
    "segment (memory the allocator reserved with cudaMalloc) at the time of the snapshot, with its segment's "
    "figures repeated; count a segment's figures once (`block_index = 0`).",
    (
        TRACE_ID,
        RANK,
        _c("device", "INTEGER", "CUDA device of the segment."),
        _c("segment_index", "BIGINT", "Index of the segment in the snapshot's `segments` list."),
        _c("segment_address", "BIGINT", "Address of the segment."),
        _c("segment_bytes", "BIGINT", "Reserved bytes of the segment (`total_size`)."),
        _c("segment_allocated_bytes", "BIGINT", "Bytes of the segment in use by tensors (`allocated_size`)."),
        _c("segment_active_bytes", "BIGINT", "Bytes in use or waiting to be freed (`active_size`)."),
        _c("segment_requested_bytes", "BIGINT", "Bytes the allocations asked for, before rounding, when given."),
        _c("stream", "BIGINT", "CUDA stream the segment belongs to."),
        _c("segment_type", "VARCHAR", "`small` or `large` pool."),
        _c("is_expandable", "BOOLEAN", "An expandable segment (`expandable_segments:True`), when given."),
        _c("block_index", "BIGINT", "Index of the block in its segment; null for a segment listed without blocks."),
        _c("block_address", "BIGINT", "Address of the block."),
        _c("block_bytes", "BIGINT", "Bytes of the block (`size`)."),
        _c("block_requested_bytes", "BIGINT", "Bytes the allocation asked for (`requested_size`), when given."),
        _c("block_state", "VARCHAR", "`active_allocated`, `active_awaiting_free` or `inactive` (free for reuse)."),
        _c("block_frame", "VARCHAR", "Where the block was allocated: the first Python frame of its stack outside "
                                     "torch (`file.py:line function`); null without one."),
    ),
    (JOB,),
)

ALLOCATOR_EVENTS = Table(
    "allocator_events",
    "The allocation history in PyTorch CUDA caching allocator snapshots (`device_traces`, recorded with "
    "`torch.cuda.memory._record_memory_history()`): one row per allocator action.",
    (
        TRACE_ID,
        EVENT_ID,
        RANK,
        _c("device", "INTEGER", "CUDA device (the index of its list in `device_traces`)."),
        _c("action", "VARCHAR", "`alloc`, `free_requested`, `free_completed`, `segment_alloc`, `segment_free`, "
                                "`segment_map`, `segment_unmap`, `oom`, `snapshot`, `annotate`, or another the "
                                "allocator writes."),
        _c("addr", "BIGINT", "Address of the block or segment; null for `oom`."),
        _c("bytes", "BIGINT", "Bytes (`size`); for `oom`, the request that failed."),
        _c("stream", "BIGINT", "CUDA stream."),
        TS,
        _c("device_free_bytes", "BIGINT", "For `oom`: bytes the device still reported free."),
        _c("frame", "VARCHAR", "The first Python frame of the action's stack outside torch (`file.py:line "
                               "function`); null without one."),
    ),
    (JOB,),
)

ET_NODES = Table(
    "et_nodes",
    "PyTorch execution trace (Chakra ET JSON) nodes: one row per record function the `ExecutionTraceObserver` "
    "saw (operators, `record_function` labels, the process and thread roots), with its parent and the tensors "
    "it read and wrote. `rf_id` joins the Kineto trace of the same run (docs/formats.md); the data dependencies "
    "between operators are `tracelake.analysis.et_deps.data_edges`.",
    (
        TRACE_ID,
        RANK,
        _c("node_id", "BIGINT", "The node's `id` (unique per trace; ids count up as record functions start)."),
        _c("parent_id", "BIGINT", "The enclosing node (`ctrl_deps`, `parent` before schema 1.0.2); null for a "
           "root (the process node names itself as its parent)."),
        _c("position", "BIGINT", "Index of the node in the file's `nodes` list: the order nodes finished "
           "(the observer writes a node when its record function returns)."),
        _c("name", "VARCHAR", "Operator or label name (`aten::add`, `[pytorch|profiler|execution_trace|thread]`)."),
        _c("rf_id", "BIGINT", "Record function id: the `Record function id` arg of the Kineto op of the same run "
           "(its `External id` in traces older than PyTorch 2.1); null when the node has none."),
        _c("fw_parent", "BIGINT", "For a backward op, the `rf_id` of the forward op it belongs to (0: none)."),
        _c("seq_id", "BIGINT", "Autograd sequence number (-1: none), as Kineto's `Sequence number`."),
        _c("scope", "BIGINT", "`at::RecordScope` (0 function, 1 backward function, 7 user scope, ...)."),
        _c("tid", "BIGINT", "The observer's thread number (1, 2, ...; not the OS thread id)."),
        _c("fw_tid", "BIGINT", "Thread of the forward op (backward ops), as Kineto's `Fwd thread id`."),
        _c("op_schema", "VARCHAR", "Operator schema (`aten::add.Tensor(Tensor self, ...) -> Tensor`); empty for "
           "labels."),
        _c("input_tensors", "BIGINT[]", "Tensor ids of the tensor inputs, in argument order (tensors inside lists "
           "included). Ids name a TensorImpl address, so a freed id can come back for a new tensor."),
        _c("input_storages", "BIGINT[]", "Storage ids of the same tensors, position for position: what identifies "
           "the data (views share it); 0: a tensor without storage."),
        _c("output_tensors", "BIGINT[]", "Tensor ids of the tensor outputs."),
        _c("output_storages", "BIGINT[]", "Storage ids of the tensor outputs, position for position."),
        _c("input_shapes", "VARCHAR", "Shapes of every input argument, as JSON (`[[256,256],[]]`)."),
        _c("output_shapes", "VARCHAR", "Shapes of every output, as JSON."),
        _c("input_types", "VARCHAR", "Types of every input argument, as JSON (`[\"Tensor(float)\",\"Int\"]`)."),
        _c("output_types", "VARCHAR", "Types of every output, as JSON."),
    ),
    (JOB,),
)
