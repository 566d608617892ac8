"""The declarations of the derived tables: analyses stored next to each trace's parsed tables (at ingest, or,
for ``critical_path``, when its job is analysed). Use them through :mod:`tracelake.contracts.schema`.
"""

from __future__ import annotations

from .columns import DUR, JOB, RANK, TRACE_ID, TS, Table
from .columns import column as _c
from .columns import ns_column as _ns

BREAKDOWN = Table(
    "breakdown",
    "Where each rank's device time went (docs/analyses.md): one row per trace and rank for the whole "
    "trace (`step` null) and one per step. Unions count overlapping ops once; the exclusive buckets "
    "(`*_only_ns`, `compute_communication_ns`, `other_overlap_ns`, `idle_ns`) add up to `span_ns`.",
    (
        TRACE_ID,
        RANK,
        _c("step", "BIGINT", "Step number, or null for the row covering the whole trace."),
        _ns("span_ns", "Last device op end minus first device op start in the window (syncs excluded)."),
        _ns("busy_ns", "Union of all device ops except syncs."),
        _ns("idle_ns", "span_ns - busy_ns: no device work at all."),
        _ns("compute_ns", "Union of compute ops."),
        _ns("communication_ns", "Union of communication ops."),
        _ns("memory_ns", "Union of memcpy/memset ops."),
        _ns("overlapped_communication_ns", "Communication that ran while compute ran."),
        _ns("exposed_communication_ns", "Communication nothing hid: communication_ns - overlapped_communication_ns."),
        _c("overlap_pct", "DOUBLE", "100 x overlapped / communication; null without communication."),
        _ns("compute_only_ns", "Only compute active."),
        _ns("communication_only_ns", "Only communication active (the exposed part that no memory op overlaps)."),
        _ns("memory_only_ns", "Only memory ops active."),
        _ns("compute_communication_ns", "Compute and communication active, no memory op."),
        _ns("other_overlap_ns", "Other mixes (memory with compute and/or communication)."),
        _ns("async_collective_ns", "Union of async collective windows (XLA start to done); not busy time."),
        _ns("exposed_async_collective_ns", "Async collective window time with no device op running."),
        _c("flops", "DOUBLE", "FLOPs of the window's device ops: the trace's own (XLA), else the estimates of the "
           "PyTorch operator calls whose first device op starts in the window (docs/analyses.md, \"Operators\"); "
           "null without either."),
        _c("flops_utilisation_pct", "DOUBLE", "100 x flops / (peak FLOP/s x span): use of the device's peak "
           "(`devices.peak_tflops`, else the known device's figure for the dtype of most model FLOPs); null "
           "without both."),
        _c("mfu_pct", "DOUBLE", "Model FLOPs utilisation: 100 x model FLOPs (matmuls, convolutions and attention "
           "of the window's operator calls; all of `flops` for XLA; without the forward ops activation checkpointing "
           "recomputes, where the ops mark them: docs/analyses.md, \"HFU and MFU\") / (the same peak x span)."),
        _c("hfu_pct", "DOUBLE", "Hardware FLOPs utilisation: as `mfu_pct`, counting every executed model FLOP, "
           "forward ops recomputed by activation checkpointing included (docs/analyses.md, \"HFU and MFU\"); equal "
           "to `mfu_pct` where nothing is recomputed."),
    ),
    (JOB,),
    derived=True,
)

KERNEL_STATS = Table(
    "kernel_stats",
    "Time per kernel name, per trace and rank (syncs excluded): the input of kernel breakdowns and fleet "
    "rankings without rescanning device_ops.",
    (
        TRACE_ID,
        RANK,
        _c("name", "VARCHAR", "Kernel or operation name."),
        _c("category", "VARCHAR", "Its category."),
        _c("count", "BIGINT", "Launches."),
        _ns("total_ns", "Summed duration."),
        _ns("mean_ns", "Mean duration (rounded to ns)."),
        _ns("p50_ns", "Median duration (rounded to ns)."),
        _ns("p95_ns", "95th percentile duration (rounded to ns)."),
        _ns("max_ns", "Longest."),
    ),
    (JOB,),
    derived=True,
)

STREAM_IDLE = Table(
    "stream_idle",
    "Idle gaps between consecutive ops on each stream, by cause (docs/analyses.md): `host_wait` (the launch "
    "came after the stream went idle), `kernel_wait` (short launch gaps), `other`.",
    (
        TRACE_ID,
        RANK,
        _c("stream", "BIGINT", "Stream."),
        _c("ops", "BIGINT", "Ops on the stream (syncs excluded)."),
        _ns("op_ns", "Summed op duration on the stream."),
        _c("gaps", "BIGINT", "Gaps between ops."),
        _ns("idle_ns", "Summed gap time."),
        _ns("host_wait_ns", "Gap time waiting for the host to launch."),
        _ns("kernel_wait_ns", "Gap time in short launch-to-launch gaps."),
        _ns("other_ns", "The rest of the gap time."),
    ),
    (JOB,),
    derived=True,
)

LAUNCH_STATS = Table(
    "launch_stats",
    "Kernel launch delays per trace and rank, and kernels shorter than their launch call.",
    (
        TRACE_ID,
        RANK,
        _c("launches", "BIGINT", "Kernels launched one by one: joined to a runtime call that is not a graph launch."),
        _ns("mean_delay_ns", "Mean of kernel start - end of its launch call (floored at 0), rounded to ns."),
        _ns("p50_delay_ns", "Median launch delay, rounded to ns."),
        _ns("p95_delay_ns", "95th percentile launch delay, rounded to ns."),
        _ns("max_delay_ns", "Longest launch delay."),
        _c("shorter_than_launch", "BIGINT", "Kernels that ran for less time than their launch call took."),
        _c("shorter_than_launch_pct", "DOUBLE", "Their share of launches, percent."),
        _ns("launch_overhead_ns", "Summed launch-call time of those kernels (one call each)."),
        _c("graph_launches", "BIGINT", "CUDA/HIP graph launch calls that started kernels (docs/analyses.md)."),
        _c("graph_kernels", "BIGINT", "Kernels those graph launches started."),
        _ns("graph_launch_ns", "Summed duration of the graph launch calls, each call once."),
        _ns("graph_mean_delay_ns", "Mean of first kernel start - end of the graph launch call (floored at 0)."),
        _ns("graph_max_delay_ns", "Longest graph launch delay."),
    ),
    (JOB,),
    derived=True,
)

GRAPH_LAUNCHES = Table(
    "graph_launches",
    "One row per CUDA/HIP graph launch (docs/analyses.md, \"Launches\"): the call, the kernels it started, "
    "their device time and the gaps between them.",
    (
        TRACE_ID,
        RANK,
        _c("correlation", "BIGINT", "Correlation id the launch call and its kernels share."),
        _c("graph_id", "BIGINT", "Graph id from the kernels' args (smallest if several); null where the trace has none."),
        _c("call", "VARCHAR", "Name of the launch call (`cudaGraphLaunch`, `hipGraphLaunch`, ...)."),
        _ns("launch_ns", "Start of the launch call."),
        _ns("call_ns", "Duration of the launch call."),
        _c("kernels", "BIGINT", "Kernels the launch started."),
        _c("streams", "BIGINT", "Streams they ran on."),
        _ns("first_ns", "Start of the first kernel."),
        _ns("device_ns", "Summed kernel time."),
        _ns("span_ns", "First kernel start to last kernel end."),
        _ns("gaps_ns", "span_ns minus the union of the kernels' busy time: idle inside the graph."),
        _ns("delay_ns", "First kernel start - end of the launch call, floored at 0."),
    ),
    (JOB,),
    derived=True,
)

CRITICAL_PATH = Table(
    "critical_path",
    "What bounded each step across the ranks of a run: its critical path, stretch by stretch "
    "(docs/analyses.md, \"Critical path\"). Computed across the run when its job is analysed (`tracelake analyze "
    "--job`, the API's job answer, which the server prepares after every upload, or a report), each rank's "
    "stretches stored with that rank's trace; empty for a trace whose job has not been analysed since it came in.",
    (
        TRACE_ID,
        RANK,
        _c("run", "VARCHAR", "Run of the job the path was computed over (docs/analyses.md, \"Runs within a job\")."),
        _c("ranks", "INTEGER", "Ranks of the run when the path was computed: fewer than the run has now means "
                               "it was computed before the others arrived."),
        _c("step", "BIGINT", "Step; null when the run has no steps."),
        _c("position", "INTEGER", "Order of the stretch on the step's path, from its start (across ranks)."),
        _c("kind", "VARCHAR", "`compute`, `communication`, `memory`, `host`, `launch`, `sync` or `idle` "
                              "(`tracelake.contracts.critical.PathKind`)."),
        _c("name", "VARCHAR", "The op, event or call the time was spent in, or what the gap was."),
        _c("process_group", "VARCHAR", "Process group of a collective's stretch."),
        TS,
        DUR,
    ),
    (JOB,),
    derived=True,
)

STREAM_QUEUES = Table(
    "stream_queues",
    "Launch queue depth per stream: +1 when a runtime call launches an op, -1 when the op starts. A queue "
    "near zero means the device waits for the host; a deep one means the host runs ahead.",
    (
        TRACE_ID,
        RANK,
        _c("stream", "BIGINT", "Stream."),
        _c("launches", "BIGINT", "Ops joined to their launching runtime call."),
        _c("max_queue", "BIGINT", "Deepest the queue got."),
        _c("mean_queue", "DOUBLE", "Time-weighted mean depth between the first launch and the last start."),
    ),
    (JOB,),
    derived=True,
)


OP_STATS = Table(
    "op_stats",
    "Device time, FLOPs and bytes per PyTorch operator (docs/analyses.md, \"Operators\"): one row per trace, rank, "
    "operator, input shapes and dtype, each device op attributed to the `cpu_op` that launched it; the device ops no "
    "operator launched are one `(no operator)` row, so `device_ns` adds up to the rank's device time (syncs "
    "excluded).",
    (
        TRACE_ID,
        RANK,
        _c("op", "VARCHAR", "Operator name (`aten::mm`), or `(no operator)`."),
        _c("input_shapes", "VARCHAR", "`Input Dims` as recorded (JSON text); null when not recorded."),
        _c("dtype", "VARCHAR", "Peak key of the estimate (`bf16`, `fp32`, ...); null without an estimate."),
        _c("kind", "VARCHAR", "Kind of the estimate: `matmul`, `conv`, `attention`, `norm`, `elementwise`, "
                              "`reduction`; null without one."),
        _c("module", "VARCHAR", "The `nn.Module` that ran the calls (`Linear_3`; a backward call takes its forward's), "
           "else the innermost frame of user code (`train.py(42): step`); null where the trace has no Python events "
           "(`with_stack`/`with_modules`). docs/analyses.md, \"Module\"."),
        _c("count", "BIGINT", "Calls that launched device ops."),
        _ns("host_ns", "Summed host duration of those calls."),
        _ns("device_ns", "Summed duration of the device ops attributed to them."),
        _c("kernels", "BIGINT", "Device ops attributed (kernels, memcpys, memsets)."),
        _c("flops", "DOUBLE", "Estimated FLOPs of the calls (each call once); null when there is no estimate, "
                              "never 0 for unknown."),
        _c("bytes", "BIGINT", "Estimated bytes read and written; null without an estimate."),
        _c("achieved_tflops", "DOUBLE", "flops / device time, TFLOP/s."),
        _c("arithmetic_intensity", "DOUBLE", "flops / bytes."),
        _c("bound", "VARCHAR", "`compute` or `memory`: intensity against the ridge point (peak FLOP/s / HBM "
                               "bytes/s) of the device; null without its peaks."),
        _c("pct_of_roofline", "DOUBLE", "Achieved FLOP/s over the peak (compute-bound) or achieved bytes/s over "
                                        "the HBM bandwidth (memory-bound), percent. Not clamped."),
        _c("above_roofline", "BOOLEAN", "pct_of_roofline > 100: the estimate or the peak is wrong."),
    ),
    (JOB,),
    derived=True,
)
