"""The declarations of the warehouse tables parsers write from profiler and NCCL output: what each table and
column means. PyTorch's memory data and execution traces are in :mod:`.profile_tables`, the tables computed
from these in :mod:`.derived_tables`.

Use them through :mod:`tracelake.contracts.schema`, which also lists them in write order.
"""

from __future__ import annotations

from .columns import DUR, EVENT_ID, JOB, RANK, STEP, TRACE_ID, TS, Table
from .columns import column as _c

TRACES = Table(
    "traces",
    "One row per ingested trace file. A trace is visible in every other table only once its row here exists.",
    (
        TRACE_ID,
        _c("format", "VARCHAR", "Input format: `pytorch_profiler` (Kineto JSON), `xla` (XSpace `.xplane.pb`), `xla_json` (trace-viewer JSON of XLA), `nccl_tests`, `nccl_inspector`, `nccl_log`, `flight_recorder`, `nccl_profiler`, `memory_timeline` (the PyTorch profiler's memory timeline export), `allocator_snapshot` (a CUDA caching allocator snapshot), `execution_trace` (a PyTorch execution trace, Chakra ET JSON), `job_lifecycle` (a job lifecycle file)."),
        _c("source_name", "VARCHAR", "File name as given at ingest."),
        _c("source_path", "VARCHAR", "Absolute path of the file on the ingesting machine (null for uploads)."),
        _c("source_bytes", "BIGINT", "Size of the file as stored (compressed if it was)."),
        _c("uncompressed_bytes", "BIGINT", "Size of the decoded content."),
        _c("labels", "MAP(VARCHAR, VARCHAR)", "User labels given at ingest (`--label key=value`)."),
        _c("host", "VARCHAR", "Host name, from the trace or its file name."),
        _c("pid", "BIGINT", "Process id of the profiled process."),
        RANK,
        _c("rank_source", "VARCHAR", "Where the rank came from: `distributedInfo`, `file name` or `default`."),
        _c("world_size", "INTEGER", "Number of ranks in the job, when the trace says."),
        _c("backend", "VARCHAR", "Distributed backend (`nccl`, `gloo`, ...)."),
        _c("nccl_version", "VARCHAR", "NCCL version the trace reports."),
        _c("device_type", "VARCHAR", "`cuda`, `rocm`, `mtia`, `tpu` or `cpu` (no device op recognised)."),
        _c("device_name", "VARCHAR", "Accelerator model, e.g. `NVIDIA H100 80GB HBM3`."),
        _c("device_count", "INTEGER", "Number of devices with operations in the trace."),
        _c("start_ns", "BIGINT", "First event start, ns."),
        _c("end_ns", "BIGINT", "Last event end, ns."),
        _c("event_count", "BIGINT", "Events in the source file."),
        _c("device_op_count", "BIGINT", "Rows in `device_ops` for this trace."),
        _c("host_op_count", "BIGINT", "Rows in `host_ops` for this trace."),
        _c("collective_count", "BIGINT", "Rows in `collectives` for this trace."),
        _c("step_count", "BIGINT", "Rows in `steps` for this trace."),
        _c("counter_count", "BIGINT", "Rows in `counters` for this trace."),
        _c("warnings", "VARCHAR[]", "Things the parser worked around (e.g. rank defaulted to 0)."),
        _c("ingested_at", "TIMESTAMPTZ", "When the trace was registered."),
        _c("parse_seconds", "DOUBLE", "Wall time the ingest took."),
        _c("tracelake_version", "VARCHAR", "tracelake version that ingested it."),
        _c("schema_version", "INTEGER", "Warehouse schema version of its files."),
    ),
    (JOB,),
)

DEVICE_OPS = Table(
    "device_ops",
    "Every operation on a device stream: kernels, memcpys, memsets and device-side syncs; XLA ops.",
    (
        TRACE_ID,
        EVENT_ID,
        RANK,
        _c("device", "INTEGER", "Device index on the host (CUDA/HIP ordinal, TPU chip, XLA CPU device)."),
        _c("stream", "BIGINT", "Stream (or XLA line) the op ran on."),
        _c("kind", "VARCHAR", "`kernel`, `memcpy`, `memset`, `sync`, or `xla_op` (an XLA op on TPU or the CPU back-end)."),
        _c("category", "VARCHAR", "`compute`, `communication`, `memory` or `sync`: a `tracelake.contracts.classify.Category` (rules: `tracelake.contracts.classify.RULES`)."),
        _c("name", "VARCHAR", "Kernel or operation name."),
        TS,
        DUR,
        _c("correlation", "BIGINT", "Correlation id joining the op to the runtime call that launched it."),
        _c("external_id", "BIGINT", "External id joining the op to the CPU operator that issued it."),
        STEP,
        _c("bytes", "BIGINT", "Bytes moved, for memcpy and memset."),
        _c("grid", "INTEGER[]", "Kernel grid dimensions."),
        _c("block", "INTEGER[]", "Kernel block dimensions."),
        _c("registers_per_thread", "INTEGER", "Registers per thread."),
        _c("shared_memory_bytes", "BIGINT", "Shared memory per block."),
        _c("occupancy_pct", "DOUBLE", "Estimated achieved occupancy, percent."),
        _c("hlo_module", "VARCHAR", "XLA: the HLO module (program) the op belongs to."),
        _c("program_id", "UBIGINT", "XLA: program id of the module."),
        _c("hlo_category", "VARCHAR", "XLA: `hlo_category` of the op (or its HLO opcode when the profile has none)."),
        _c("long_name", "VARCHAR", "XLA: the op's full HLO text (TPU) or kernel name."),
        _c("flops", "DOUBLE", "XLA: floating-point operations of the op, when the profile gives them."),
        _c("bytes_accessed", "BIGINT", "XLA: bytes the op reads and writes, when the profile gives them."),
        _c("graph_id", "BIGINT", "CUDA/HIP graph the op ran in (Kineto's `graph id` arg, CUDA 12+); null outside a "
           "graph or where the trace does not say."),
    ),
    (JOB,),
)

HOST_OPS = Table(
    "host_ops",
    "CPU-side events: operators, runtime and driver calls, annotations, Python functions.",
    (
        TRACE_ID,
        EVENT_ID,
        RANK,
        _c("pid", "BIGINT", "Process id."),
        _c("tid", "BIGINT", "Thread id."),
        _c("cat", "VARCHAR", "Profiler category: `cpu_op`, `user_annotation`, `cuda_runtime`, `cuda_driver`, `python_function`, ..."),
        _c("name", "VARCHAR", "Operator, call or annotation name."),
        TS,
        DUR,
        _c("depth", "INTEGER", "Nesting depth on its thread (0 = outermost)."),
        _c("parent_id", "BIGINT", "`event_id` of the innermost enclosing event on the same thread."),
        _c("correlation", "BIGINT", "Correlation id (runtime and driver calls)."),
        _c("external_id", "BIGINT", "External id (operators; launch calls carry the id of their operator)."),
        _c("sequence_number", "BIGINT", "Autograd sequence number joining forward and backward operators."),
        _c("fwd_thread_id", "BIGINT", "For backward operators, the forward thread."),
        _c("input_dims", "VARCHAR", "Input shapes as JSON text, when recorded."),
        _c("input_types", "VARCHAR", "Input dtypes as JSON text, when recorded."),
        _c("flops", "DOUBLE", "Estimated FLOPs of the operator (with_flops)."),
        _c("concrete_inputs", "VARCHAR", "The operator's `Concrete Inputs` (scalar and list arguments) as JSON text, "
           "kept for `c10d::` collectives and the operators whose cost needs them (convolutions, attention, "
           "reductions); null for the others."),
        STEP,
        _c("record_function_id", "BIGINT", "Kineto: the operator's `Record function id` arg, the id PyTorch "
           "execution traces (Chakra ET nodes' `rf_id`) give the same operator; null where the trace has none (Kineto "
           "writes 0 unless an execution trace observer numbered the operators)."),
    ),
    (JOB,),
)

COLLECTIVES = Table(
    "collectives",
    "One row per collective or point-to-point call, linked to the device kernel that ran it.",
    (
        TRACE_ID,
        EVENT_ID,
        RANK,
        _c("collective", "VARCHAR", "Operation as PyTorch names it: `allreduce`, `allgather`, `reduce_scatter`, `all_to_all`, `broadcast`, `send`, `recv`, ..."),
        _c("process_group", "VARCHAR", "Process group name."),
        _c("process_group_desc", "VARCHAR", "Process group description (`default_pg`, ...)."),
        _c("group_ranks", "VARCHAR", "Global ranks in the group, as written by the profiler (e.g. `[0, 1]`)."),
        _c("group_size", "INTEGER", "Ranks in the group."),
        _c("seq", "BIGINT", "Sequence number of the collective in its process group (same on every rank)."),
        _c("dtype", "VARCHAR", "Element type (`Float`, `BFloat16`, ...)."),
        _c("in_nelems", "BIGINT", "Input elements on this rank."),
        _c("out_nelems", "BIGINT", "Output elements on this rank."),
        _c("message_bytes", "BIGINT", "Size of the operation as nccl-tests counts it: max(input, output) bytes on this rank."),
        _c("src_rank", "INTEGER", "Source rank (point-to-point, broadcast)."),
        _c("dst_rank", "INTEGER", "Destination rank (point-to-point)."),
        _c("ts_ns", "BIGINT", "Start of the device kernel (the CPU call when no kernel is linked)."),
        _c("dur_ns", "BIGINT", "Duration of the device kernel (the CPU call when no kernel is linked)."),
        _c("cpu_ts_ns", "BIGINT", "Start of the CPU-side call."),
        _c("cpu_dur_ns", "BIGINT", "Duration of the CPU-side call."),
        _c("kernel_event_id", "BIGINT", "`device_ops.event_id` of its kernel, when linked."),
        _c("kernel_name", "VARCHAR", "Name of its kernel."),
        _c("stream", "BIGINT", "Stream of its kernel."),
        STEP,
        _c("is_async", "BOOLEAN", "XLA: an async collective's start-to-done window (not a device op)."),
        _c("algorithm", "VARCHAR", "NCCL algorithm (`RING`, `TREE`, `NVLS`, ...), when the source says."),
        _c("protocol", "VARCHAR", "NCCL protocol (`LL`, `LL128`, `SIMPLE`), when the source says."),
        _c("channels", "INTEGER", "NCCL channels used, when the source says."),
        _c("reduction", "VARCHAR", "Reduction (`sum`, `prod`, `min`, `max`, `avg`, `premul_sum`), when the source says."),
        _c("source", "VARCHAR", "Where the row's facts came from: `record_param_comms`, `kernel_args`, `kernel_name`, "
           "`cpu_op` (Kineto); `xla`, `nccl_inspector`, `nccl_log`, `flight_recorder`, `nccl_profiler`."),
    ),
    (JOB,),
)

STEPS = Table(
    "steps",
    "Training or inference steps per rank, from `ProfilerStep#N` annotations.",
    (
        TRACE_ID,
        RANK,
        STEP,
        _c("ts_ns", "BIGINT", "Step start on the CPU, ns."),
        _c("dur_ns", "BIGINT", "Step duration on the CPU, ns."),
        _c("device_start_ns", "BIGINT", "First device op of the step starts, ns."),
        _c("device_end_ns", "BIGINT", "Last device op of the step ends, ns."),
        _c("device_op_count", "BIGINT", "Device ops in the step."),
    ),
    (JOB,),
)

COUNTERS = Table(
    "counters",
    "Counter samples: the trace's `C` (counter) events. Allocator totals of `[memory]` instants are in "
    "`memory_events` (`total_allocated`, `total_reserved`), not here.",
    (
        TRACE_ID,
        RANK,
        _c("name", "VARCHAR", "Counter series, as the trace names it."),
        _c("device", "INTEGER", "Device the sample is for, when known (-1 for the CPU)."),
        TS,
        _c("value", "DOUBLE", "Sample value."),
    ),
    (JOB,),
)

DEVICES = Table(
    "devices",
    "The accelerators a trace ran on, with their peak figures where the profile gives them (for MFU and "
    "rooflines), and the network devices its NCCL logs name.",
    (
        TRACE_ID,
        RANK,
        _c("device", "INTEGER", "Device index, as in `device_ops.device`."),
        _c("kind", "VARCHAR", "`tpu`, `gpu`, `cpu`, or `nic`: a network device NCCL names (`mlx5_0:1/IB`, "
                              "`mlx5_0:1/RoCE`, `eth0`), with `device` its index and no rank."),
        _c("name", "VARCHAR", "Model, e.g. `TPU v6 Lite`."),
        _c("vendor", "VARCHAR", "Vendor, when given."),
        _c("peak_tflops", "DOUBLE", "Peak dense TFLOP/s, when given."),
        _c("peak_hbm_gbps", "DOUBLE", "Peak memory bandwidth, GB/s, when given."),
        _c("core_count", "INTEGER", "Cores (SMs, CUs), when given."),
        _c("clock_mhz", "DOUBLE", "Clock rate, MHz, when given."),
        _c("memory_bytes", "BIGINT", "Device memory, when given."),
        _c("compute_capability", "VARCHAR", "Compute capability (`9.0`), when given."),
    ),
    (JOB,),
)


NCCL_BENCHMARKS = Table(
    "nccl_benchmarks",
    "nccl-tests results: one row per message size and placement (out-of-place, in-place).",
    (
        TRACE_ID,
        RANK,
        _c("collective", "VARCHAR", "Benchmark: `all_reduce`, `all_gather`, `reduce_scatter`, `alltoall`, ..."),
        _c("size_bytes", "BIGINT", "Message size in bytes, as nccl-tests counts it."),
        _c("count", "BIGINT", "Elements."),
        _c("dtype", "VARCHAR", "Element type (`float`, `half`, ...)."),
        _c("redop", "VARCHAR", "Reduction (`sum`, ...; null where the build does not print it)."),
        _c("root", "INTEGER", "Root rank (-1 for none; null where the build does not print it)."),
        _c("in_place", "BOOLEAN", "In-place run (false: out-of-place)."),
        _c("time_us", "DOUBLE", "Time per operation, us."),
        _c("algbw_gbs", "DOUBLE", "Algorithm bandwidth, GB/s (bytes / time)."),
        _c("busbw_gbs", "DOUBLE", "Bus bandwidth, GB/s (algbw x the collective's factor)."),
        _c("wrong", "BIGINT", "Wrong results counted by validation (null: validation off)."),
        _c("ranks", "INTEGER", "Ranks in the run, when the output lists them."),
        _c("nodes", "INTEGER", "Distinct hosts among the ranks, when the output lists them."),
    ),
    (JOB,),
)


COMMUNICATORS = Table(
    "communicators",
    "NCCL communicators per rank, from the init lines of NCCL debug logs.",
    (
        TRACE_ID,
        RANK,
        _c("comm", "VARCHAR", "Communicator address on this rank (`0x...`)."),
        _c("comm_id", "VARCHAR", "Communicator id, the same on every rank (newer NCCL)."),
        _c("nranks", "INTEGER", "Ranks in the communicator."),
        _c("nodes", "INTEGER", "Nodes it spans."),
        _c("local_ranks", "INTEGER", "Ranks of it on this node."),
        _c("local_rank", "INTEGER", "This rank's index on its node."),
        _c("cuda_dev", "INTEGER", "CUDA device."),
        _c("nvml_dev", "INTEGER", "NVML device."),
        _c("bus_id", "VARCHAR", "PCI bus id of the GPU."),
        _c("host", "VARCHAR", "Host."),
        _c("pid", "BIGINT", "Process id."),
    ),
    (JOB,),
)

COMM_CHANNELS = Table(
    "comm_channels",
    "NCCL channel connections and their transports (`P2P/IPC`, `SHM/direct/direct`, `NET/IB/0/GDRDMA`, "
    "`NET/Socket/0`), from debug logs.",
    (
        TRACE_ID,
        RANK,
        _c("channel", "INTEGER", "Channel."),
        _c("src_rank", "INTEGER", "Sending rank."),
        _c("dst_rank", "INTEGER", "Receiving rank."),
        _c("transport", "VARCHAR", "Transport as NCCL prints it."),
        _c("direction", "VARCHAR", "`send` or `receive` where the log says."),
    ),
    (JOB,),
)


FLIGHT_RECORDER_STATUS = Table(
    "flight_recorder_status",
    "Per rank and process group, from PyTorch Flight Recorder dumps: the seq of the last collective enqueued, "
    "started and completed. A rank whose last completed seq is behind what the others enqueued is hung or late.",
    (
        TRACE_ID,
        RANK,
        _c("process_group", "VARCHAR", "Process group."),
        _c("last_enqueued", "BIGINT", "Seq of the last collective enqueued."),
        _c("last_started", "BIGINT", "Seq of the last collective started."),
        _c("last_completed", "BIGINT", "Seq of the last collective completed."),
    ),
    (JOB,),
)


JOB_LIFECYCLE = Table(
    "job_lifecycle",
    "A job's life from submission to its end, from a job lifecycle file (docs/formats.md, \"Job lifecycle\"): "
    "one row per event. Goodput is computed from it (docs/analyses.md, \"Goodput\").",
    (
        TRACE_ID,
        _c("declared_job", "VARCHAR", "The job the file names (`job`); figures join on the trace's `job`, the "
                                      "one given at ingest."),
        _c("event", "VARCHAR", "`submitted`, `started` (resources held), `first_step`, `checkpoint`, `restart` or "
                               "`ended`."),
        _c("seq", "INTEGER", "Position of a `checkpoint` or `restart` in its list in the file, from 0; 0 for the "
                             "other events."),
        _c("at_ns", "BIGINT", "When it happened, ns since the Unix epoch (UTC); for a `restart`, when the job "
                              "failed."),
        _c("step", "BIGINT", "`checkpoint`: the step it saved, when given."),
        _c("dur_ns", "BIGINT", "`checkpoint`: how long the job was blocked writing it."),
        _c("lost_since_ns", "BIGINT", "`restart`: start of the work the failure lost (the last checkpoint, or the "
                                      "first step), ns since the epoch."),
        _c("resumed_ns", "BIGINT", "`restart`: when the job was making progress again, when given (else the "
                                   "recovery is not measured)."),
        _c("steps", "BIGINT", "`ended`: steps the job completed, when given."),
        _c("productive_ns", "BIGINT", "`ended`: time spent in training steps, when the job measured it "
                                      "(`productive_step_seconds`)."),
    ),
    (JOB,),
)
