"""The API's request and answer shapes, declared once for validation and the OpenAPI schema."""

from __future__ import annotations

import datetime as dt
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

TRACE_ID = r"^[0-9a-f]{1,64}$"
JOB = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
_ID_EXAMPLE = "3f2a9c41d07be8a15c66"
#: The values of :class:`tracelake.contracts.status.TaskStatus`, spelled out so the OpenAPI schema
#: lists them inline (tests/test_contracts.py checks that the two agree).
TaskStatusName = Literal["queued", "ingesting", "done", "failed"]


class ErrorAnswer(BaseModel):
    """What every refused request answers: a message for a person, and the kind of error."""

    error: str
    kind: str
    model_config = ConfigDict(json_schema_extra={"examples": [
        {"error": "rank-3.json.gz: gzip stream ends early at byte 1048576 (truncated upload?)", "kind": "TraceFormatError"}
    ]})


class TraceState(BaseModel):
    """Where one uploaded trace is: queued, ingesting, done or failed (with the reason)."""

    trace_id: str
    name: str
    job: str
    status: TaskStatusName
    error: str | None = None
    submitted_at: dt.datetime | None = None
    finished_at: dt.datetime | None = None
    already_present: bool = Field(False, description="The same bytes were ingested before: the existing trace.")
    url: str
    model_config = ConfigDict(json_schema_extra={"examples": [{
        "trace_id": _ID_EXAMPLE, "name": "rank-0.pt.trace.json.gz", "job": "llama-70b", "status": "queued",
        "error": None, "submitted_at": "2026-12-02T06:00:00Z", "finished_at": None, "already_present": False,
        "url": f"/api/v1/traces/{_ID_EXAMPLE}",
    }]})


class UploadAnswer(BaseModel):
    """The traces an upload became (an archive becomes one per trace file in it)."""

    job: str
    labels: dict[str, str]
    files: int = Field(description="Files received (archives count once).")
    bytes: int = Field(description="Bytes received.")
    traces: list[TraceState]


class TraceDetail(BaseModel):
    """One trace: its ingest status and, once done, its row of the ``traces`` table."""

    trace_id: str
    job: str | None
    status: TaskStatusName
    error: str | None = None
    trace: dict[str, Any] | None = Field(None, description="The trace's `traces` row (see docs/schema.md).")


class TracePage(BaseModel):
    """One page of registered traces, newest first."""

    traces: list[dict[str, Any]]
    total: int
    limit: int
    offset: int
    next: str | None = Field(None, description="The URL of the next page, if there is one.")


class JobSummary(BaseModel):
    """One job: how many traces and ranks, which formats, how many bytes, and when."""

    job: str
    traces: int
    ranks: int
    formats: list[str]
    source_bytes: int | None
    device_ops: int | None
    start_ns: int | None
    end_ns: int | None
    first_ingested_at: dt.datetime | None
    last_ingested_at: dt.datetime | None


class JobList(BaseModel):
    """Every job in the warehouse, most recently ingested first."""

    jobs: list[JobSummary]


class JobAnalysis(BaseModel):
    """Every analysis of a job, as ``tracelake analyze --json`` prints it (definitions: docs/analyses.md)."""

    job: str
    traces: int
    runs: list[dict[str, Any]] = Field(description="The job's runs (docs/analyses.md, \"Runs within a job\"), with a "
                                       "`warning` where a rank repeats; with more than one, every row below has a `run`.")
    findings: list[dict[str, Any]] = Field(description="What to fix first: largest possible gain first.")
    breakdown: list[dict[str, Any]] = Field(description="Device time per rank: compute, communication, exposed, idle.")
    last_arrivals: list[dict[str, Any]] = Field(description="Stragglers: the ranks that arrive last at collectives.")
    top_kernels: list[dict[str, Any]]
    critical_path: list[dict[str, Any]] = Field(
        description="What bounds each step across the ranks (docs/analyses.md, \"Critical path\"): one row per step: "
                    "`step`, `ranks`, `measured_ns`, `length_ns`, `residual_pct`, `bounding_rank` (the rank with the "
                    "most time on the path) and the time on the path by kind, `compute_ns`, `communication_ns`, "
                    "`memory_ns`, `host_ns`, `launch_ns`, `sync_ns`, `idle_ns` (they add up to `length_ns`).")
    critical_path_stretches: list[dict[str, Any]] = Field(
        description="Each step's critical path, stretch by stretch in order: `step`, `position`, `rank`, `trace_id`, `kind` "
                    "(compute, communication, memory, host, launch, sync, idle), `name`, `process_group` (a collective's), "
                    "`start_ns`, `dur_ns`.")
    what_if: list[dict[str, Any]] = Field(
        description="Each step replayed under each what-if scenario (`as_measured`, `communication_overlapped`, "
                    "`bandwidth_x2`, `compute_x2`, `no_launch_overhead`, `slowest_rank_at_median`, `ranks_x2`, "
                    "`nccl_tests_bandwidth` where the job holds nccl-tests output, and `<target> x<factor>` per "
                    "`what_if` asked for): `step`, "
                    "`scenario`, `changed_rank`, `measured_ns`, `predicted_ns`, `saving_ns`, `saving_pct` and the predicted "
                    "path's time by kind (`compute_ns` ... `idle_ns`).")
    parallelism: list[dict[str, Any]] = Field(
        description="Communication per process group (docs/analyses.md, \"Parallelism\"): `process_group`, "
                    "`description`, `dimension` (data, tensor, pipeline, context, expert, sequence), `basis` (name, "
                    "operations or ranks), `group_size`, `ranks`, `collectives`, `operations`, `time_ns` and "
                    "`exposed_ns` (per rank, on average), `critical_ns` and `critical_pct` (on the critical paths), "
                    "`a2a_imbalance_pct` (all-to-all: the busiest rank's excess over the mean).")
    pipeline_bubbles: list[dict[str, Any]] = Field(
        description="Per pipeline stage and step: `rank`, `step`, `stages`, `microbatches`, `span_ns`, `busy_ns`, "
                    "`bubble_ns`, `bubble_pct`, and the schedule's own bubble `schedule_bubble_pct`, "
                    "(p - 1) / (m + p - 1).")
    memory: list[dict[str, Any]] = Field(
        description="Device memory per trace, rank and device (docs/analyses.md, \"Memory\"; empty without "
                    "Kineto `[memory]` events): `peak_allocated_bytes`, `peak_reserved_bytes` (the trace's own running "
                    "totals' maxima), `capacity_bytes` (`totalGlobalMem`), `headroom_bytes` and `headroom_pct` "
                    "(capacity minus peak reserved), `fragmentation_bytes` (reserved minus allocated at the allocated "
                    "peak), `peak_ts_ns`, `peak_step`, `before_trace_bytes`, `events`, `ooms`, and the growth of what "
                    "survives each step, `slope_bytes_per_step` and `leak`. Under `analysis`: `memory_live_at_peak`, "
                    "`memory_by_category`, `memory_growth`, `allocator_churn`, and from allocator snapshots "
                    "`allocator_snapshots`, `allocator_live`, `allocator_ooms`.")
    analysis: dict[str, Any] = Field(description="Every other analysis: idle by stream, launches, steps, collectives, "
                                     "memory held at the peak, by category, growth and allocator churn, allocator "
                                     "snapshots, `top_operators`, `top_modules` (docs/analyses.md, \"Module\"), the "
                                     "6·N·D cross-check `model_flops` (docs/analyses.md, \"6·N·D cross-check\")...")


class SqlQuery(BaseModel):
    """One read-only SQL query over the warehouse views (``traces``, ``device_ops``, ...)."""

    sql: str = Field(min_length=1, max_length=100_000)
    max_rows: int | None = Field(None, ge=1, description="Return at most this many rows (never more than the server's limit).")
    model_config = ConfigDict(json_schema_extra={"examples": [
        {"sql": "SELECT rank, category, sum(dur_ns) / 1e6 AS ms FROM device_ops GROUP BY ALL ORDER BY 1, 2"}
    ]})


class SqlAnswer(BaseModel):
    """A query's rows, column names and DuckDB types; ``truncated`` when rows were left out.

    ``truncated_by`` says which limit cut the answer: ``rows`` (``max_rows`` or the server's
    ``sql_max_rows``) or ``bytes`` (``sql_max_bytes``). Values are JSON: timestamps and dates
    as ISO 8601 text, intervals as ISO 8601 durations, BLOBs as base64, NaN and infinities as null.
    """

    columns: list[str]
    types: list[str]
    rows: list[list[Any]]
    row_count: int
    truncated: bool
    truncated_by: Literal["rows", "bytes"] | None = None
    model_config = ConfigDict(json_schema_extra={"examples": [
        {"columns": ["rank", "ms"], "types": ["INTEGER", "DOUBLE"], "rows": [[0, 12.5], [1, 13.1]],
         "row_count": 2, "truncated": False, "truncated_by": None}
    ]})


class Health(BaseModel):
    """The server is up."""

    status: Literal["ok"]
    version: str
    queue_depth: int


class ArchivedReportInfo(BaseModel):
    """One fleet report of the history in ``$TRACELAKE_HOME/reports/``."""

    name: str
    url: str = Field(description="Where the report is served.")
    scheduled_for: dt.datetime = Field(description="When it was due: the schedule's run time, or when it was asked for.")
    generated_at: dt.datetime
    trigger: Literal["schedule", "missed", "manual"] = Field(
        description="`schedule`: on time; `missed`: at start-up, for a run the server was down for; "
        "`manual`: `tracelake report scheduled`.")
    since: dt.datetime | None = Field(description="It covers traces ingested from then until it was due; "
                                      "null: every trace.")
    traces: int
    jobs: int
    job_reports: int = Field(description="Job reports kept beside it (the top offenders').")
    seconds: float = Field(description="How long it took to make.")
    bytes: int


class ReportList(BaseModel):
    """The history of fleet reports, newest first, and the schedule that makes them."""

    reports: list[ArchivedReportInfo]
    schedule: str | None = Field(description="The cron schedule (`TRACELAKE_REPORT_SCHEDULE`); null: none.")
    timezone: str
    next_run: dt.datetime | None = Field(description="When the next scheduled report is due (UTC).")
    last_error: str | None = Field(None, description="Why the last scheduled run failed, if it did.")
    model_config = ConfigDict(json_schema_extra={"examples": [{
        "reports": [{"name": "fleet-20261207T060000Z", "url": "/api/v1/reports/fleet-20261207T060000Z/index.html",
                     "scheduled_for": "2026-12-07T06:00:00Z", "generated_at": "2026-12-07T06:00:03Z",
                     "trigger": "schedule", "since": "2026-11-30T06:00:00Z", "traces": 10000, "jobs": 2500,
                     "job_reports": 10, "seconds": 3.1, "bytes": 54000000}],
        "schedule": "0 6 * * MON", "timezone": "UTC", "next_run": "2026-12-14T06:00:00Z", "last_error": None}]})


class FleetAnswer(BaseModel):
    """The fleet's figures, as the fleet report shows them (definitions: docs/analyses.md, "Fleet" and "Goodput")."""

    since: dt.datetime | None
    until: dt.datetime | None
    labels: dict[str, str]
    now: dt.datetime = Field(description="Reference time of the week-over-week comparison.")
    totals: list[dict[str, Any]] = Field(description="One row: device-hours, busy, useful (x MFU) and wasted "
                                         "device-hours, utilisation, MFU of the whole selection.")
    by_job: list[dict[str, Any]]
    by_day: list[dict[str, Any]]
    by_week: list[dict[str, Any]]
    by_label: list[dict[str, Any]] = Field(description="Per label key and value (`team`, `cluster`, ...).")
    by_device: list[dict[str, Any]]
    offenders: list[dict[str, Any]] = Field(description="Jobs ranked by wasted device-hours.")
    lost_work: list[dict[str, Any]] = Field(description="Jobs ranked by useful work lost, device-hours x (1 - MFU); "
                                            "`useful_hours` null where no device of the job has an MFU.")
    week_over_week: list[dict[str, Any]]
    week_over_week_by_job: list[dict[str, Any]]
    stragglers: list[dict[str, Any]]
    slowest_collectives: list[dict[str, Any]]
    memory: list[dict[str, Any]]
    goodput: list[dict[str, Any]] = Field(description="Per job with a lifecycle file: `goodput` = "
                                          "`scheduling_goodput` x `runtime_goodput` x `program_goodput`, and the "
                                          "badput buckets (`*_ns`) that add up to `wall_ns` with `goodput_ns`.")
    seconds: float
