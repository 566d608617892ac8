"""Invariants every analysis keeps, on every real and sample trace and on generated ones.

docs/analyses.md, "Findings" and "Breakdown": a finding's gain never exceeds the span
of the traces and ranks it names, and it names them; busy + idle = span; the exclusive
buckets add up to busy; launch time counted never exceeds the host's runtime-call time;
no negative durations or counts; every NCCL/RCCL kernel belongs to a collective; every
device op has a known category (or its trace says why not); every device event of a
Kineto file reaches ``device_ops``. Each check compares with counts taken independently
of the analysis (SQL over the parsed tables, the raw JSON, the generator's own summary),
never an analysis with itself. Failures name the job (one per real trace folder or
sample scenario) and the invariant.
``findings.bound`` and ``findings.spans`` themselves, on made-up spans, are in
``test_findings_bound.py``.
"""

from __future__ import annotations

import functools
import gzip
import re
import tempfile
from collections.abc import Callable
from pathlib import Path

import duckdb
import orjson
import polars as pl
import pytest
from support import REAL_TRACES, ROOT
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tracelake.analysis.assemble import Analysis
from tracelake.contracts.critical import GROWING, PATH_KINDS
from tracelake.sample_traces import generate, generate_xla
from tracelake.warehouse import Warehouse

SAMPLE_ROOT = ROOT / "sample_traces"

#: Device-side activity categories of Kineto JSON (libkineto's ActivityType names).
KINETO_DEVICE_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset", "cuda_sync", "mtia_ccp_events"})
#: Host calls into the accelerator runtime or driver (cuda_runtime, cuda_driver, mtia_runtime, ...).
RUNTIME_CAT = "(?i)runtime|driver"
#: NCCL and RCCL kernels by name (NCCL < 2.19: ncclKernel_*, since: ncclDevKernel_*; RCCL keeps nccl names).
NCCL_KERNEL = r"(?i)^(nccl|rccl)|nccl(dev)?kernel"
#: The categories a device op may have (docs/analyses.md, "Classification of device ops").
KNOWN_CATEGORIES = ("compute", "communication", "memory", "sync")
#: The exclusive buckets of busy time (contracts/tables.py, BREAKDOWN).
BUCKETS = ("compute_only_ns", "communication_only_ns", "memory_only_ns", "compute_communication_ns",
           "other_overlap_ns")


def _jobs() -> dict[str, list[Path]]:
    """Every real trace folder and sample scenario, one job each (absent folders are left out)."""
    jobs: dict[str, list[Path]] = {}
    kineto = REAL_TRACES / "pytorch_profiler"
    if kineto.is_dir():
        for folder in sorted(p for p in kineto.iterdir() if p.is_dir()):
            jobs[f"real_{folder.name}"] = [folder]
    mtia = REAL_TRACES / "pytorch_other" / "hta_mtia_single_rank"
    if mtia.is_dir():
        jobs["real_hta_mtia_single_rank"] = [mtia]
    xla = REAL_TRACES / "xla"
    if xla.is_dir():  # jax_cpu_4dev holds one run in three renderings: ingested as a profile run folder
        for entry in sorted(xla.iterdir()):
            jobs["real_xla_" + re.sub(r"\W", "_", entry.name.removesuffix(".xplane.pb"))] = [entry]
    for kind in sorted(p for p in SAMPLE_ROOT.iterdir() if p.is_dir()):
        for scenario in sorted(p for p in kind.iterdir() if p.is_dir()):
            jobs[f"sample_{kind.name}_{scenario.name}"] = [scenario]
    return jobs


JOBS = _jobs()


def _frame(con: duckdb.DuckDBPyConnection, sql: str, params: list[object]) -> pl.DataFrame:
    return con.sql(sql, params=params).pl()


def _raw_device_events(path: Path) -> int | None:
    """Device events in a Kineto JSON file, counted from the raw JSON; None for other formats."""
    if not path.name.endswith((".json", ".json.gz")):
        return None
    data = orjson.loads(gzip.decompress(path.read_bytes()) if path.name.endswith(".gz") else path.read_bytes())
    events = data.get("traceEvents", []) if isinstance(data, dict) else data
    return sum(1 for e in events
               if isinstance(e, dict) and e.get("ph") == "X" and str(e.get("cat", "")).lower() in KINETO_DEVICE_CATS)


# -- the invariants: each returns what breaks it, in words (empty: holds) -------------------------------


#: Findings whose cause is host time: what they save is bounded by the device's idle time.
HOST_SIDE = ("short_kernels", "host_wait")


@functools.lru_cache(maxsize=4)
def _analysis(wh: Warehouse, job: str) -> Analysis:
    """``wh.analyze(job=job)``, once per job for all the checks of one warehouse (it only grows)."""
    return wh.analyze(job=job)


def check_findings(wh: Warehouse, job: str, con: duckdb.DuckDBPyConnection) -> list[str]:
    """Each finding names traces and ranks of the job, in the JSON and in words, and gains at most their span.

    The span is taken independently: device_ops' last end - first start per (trace, rank), syncs left out;
    without device ops the trace's end - start; without those the extent of its collectives.
    """
    spans = _frame(con, """
        WITH pairs AS (SELECT trace_id, rank FROM device_ops WHERE job = ?
                       UNION SELECT trace_id, rank FROM traces WHERE job = ?
                       UNION SELECT trace_id, rank FROM collectives WHERE job = ?),
             dev AS (SELECT trace_id, rank, max(ts_ns + dur_ns) - min(ts_ns) AS ns FROM device_ops
                     WHERE job = ? AND category <> 'sync' GROUP BY ALL),
             tr AS (SELECT trace_id, any_value(end_ns - start_ns) AS ns FROM traces WHERE job = ? GROUP BY ALL),
             col AS (SELECT trace_id, rank, max(ts_ns + coalesce(dur_ns, 0)) - min(ts_ns) AS ns FROM collectives
                     WHERE job = ? GROUP BY ALL)
        SELECT p.trace_id, p.rank, coalesce(dev.ns, tr.ns, col.ns) AS span_ns
        FROM pairs p LEFT JOIN dev USING (trace_id, rank) LEFT JOIN tr USING (trace_id)
                     LEFT JOIN col USING (trace_id, rank)""", [job] * 6)
    # Idle time counted independently: the gaps between merged device-op intervals, syncs left out.
    idle = _frame(con, """
        WITH o AS (SELECT trace_id, rank, ts_ns AS s, ts_ns + dur_ns AS e FROM device_ops
                   WHERE job = ? AND category <> 'sync'),
             m AS (SELECT *, max(e) OVER (PARTITION BY trace_id, rank ORDER BY s, e
                                          ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS before FROM o)
        SELECT trace_id, rank, CAST(sum(greatest(s - before, 0)) AS BIGINT) AS idle_ns FROM m GROUP BY ALL""", [job])
    job_traces = set(spans["trace_id"].to_list())
    problems = []
    for f in _analysis(wh, job).findings:
        if f.kind in HOST_SIDE and f.gain_ns > 0:
            # Host time saved can only fill the device's idle gaps: the device's own work stays.
            mine_idle = idle.filter(pl.col("trace_id").is_in(list(f.traces)) & pl.col("rank").is_in(list(f.ranks)))
            most = int(mine_idle["idle_ns"].max() or 0) if mine_idle.height else 0
            if f.gain_ns > most:
                problems.append(f"{f.kind} finding: host-side gain {f.gain_ns} ns above the rank's idle {most} ns")
        name = f"{f.kind} finding"
        words = f"{f.title} {f.detail}"
        if f.gain_ns < 0:
            problems.append(f"{name}: negative gain {f.gain_ns}")
        if not f.traces or not f.ranks:
            problems.append(f"{name}: names traces {f.traces} and ranks {f.ranks} (both must be given)")
        if set(f.traces) - job_traces:
            problems.append(f"{name}: names traces {sorted(set(f.traces) - job_traces)} not in the job")
        mine = spans.filter(pl.col("trace_id").is_in(list(f.traces or job_traces)))
        if f.ranks:
            mine = mine.filter(pl.col("rank").is_in(list(f.ranks)))
        if f.ranks and mine.is_empty():
            problems.append(f"{name}: ranks {f.ranks} of traces {f.traces} not in the job")
        known = mine["span_ns"].drop_nulls()
        limit = int(known.max()) if known.len() else None  # type: ignore[arg-type]
        if f.gain_ns > 0 and (limit is None or f.gain_ns > limit):
            problems.append(f"{name}: gain {f.gain_ns} ns above the {limit} ns span it was measured on")
        if f.uncapped_gain_ns is not None:
            problems.append(f"{name}: estimate {f.uncapped_gain_ns} ns exceeded the {limit} ns span "
                            f"(capped to {f.gain_ns})")
        if "rank" not in words.lower():
            problems.append(f"{name}: words name no rank: {words!r}")
        if len(job_traces) > 1 and f.traces and not any(t[:8] in words for t in f.traces):
            problems.append(f"{name}: job has {len(job_traces)} traces, words name none of {f.traces}")
        if f.as_dict()["traces"] != list(f.traces) or f.as_dict()["ranks"] != list(f.ranks):
            problems.append(f"{name}: JSON lacks its traces or ranks")
    return problems


def check_busy_idle_span(wh: Warehouse, job: str, con: duckdb.DuckDBPyConnection) -> list[str]:
    """busy + idle = span on every breakdown row; a whole-trace span is device_ops' last end - first start.

    Syncs (device-side waits) are no work and lie outside the span (docs/analyses.md, "Breakdown").
    """
    rows = _frame(con, """
        SELECT b.trace_id, b.rank, b.step, b.span_ns, b.busy_ns, b.idle_ns, d.ns AS ops_span_ns
        FROM breakdown b LEFT JOIN (SELECT trace_id, rank, max(ts_ns + dur_ns) - min(ts_ns) AS ns FROM device_ops
                                    WHERE job = ? AND category <> 'sync' GROUP BY ALL) d USING (trace_id, rank)
        WHERE b.job = ?""", [job, job])
    problems = [f"trace {r['trace_id'][:12]} rank {r['rank']} step {r['step']}: busy {r['busy_ns']} + idle "
                f"{r['idle_ns']} != span {r['span_ns']}"
                for r in rows.filter(pl.col("busy_ns") + pl.col("idle_ns") != pl.col("span_ns")).to_dicts()]
    whole = rows.filter(pl.col("step").is_null())
    problems += [f"trace {r['trace_id'][:12]} rank {r['rank']}: span {r['span_ns']} != device ops' extent "
                 f"{r['ops_span_ns']}"
                 for r in whole.filter(pl.col("span_ns") != pl.col("ops_span_ns")).to_dicts()]
    with_ops = _frame(con, "SELECT DISTINCT trace_id, rank FROM device_ops WHERE job = ? AND category <> 'sync'",
                      [job])
    missing = with_ops.join(whole.select("trace_id", "rank"), on=["trace_id", "rank"], how="anti")
    problems += [f"trace {r['trace_id'][:12]} rank {r['rank']}: device ops but no whole-trace breakdown row"
                 for r in missing.to_dicts()]
    return problems


def check_buckets(wh: Warehouse, job: str, con: duckdb.DuckDBPyConnection) -> list[str]:
    """The exclusive buckets add up to busy; unions lie between the longest op and the sum of durations."""
    rows = _frame(con, f"""
        WITH ops AS (SELECT trace_id, rank,
                            sum(dur_ns) FILTER (WHERE category <> 'sync') AS busy_sum,
                            max(dur_ns) FILTER (WHERE category <> 'sync') AS busy_max,
                            coalesce(sum(dur_ns) FILTER (WHERE category = 'compute'), 0) AS compute_sum,
                            coalesce(sum(dur_ns) FILTER (WHERE category = 'communication'), 0) AS comm_sum
                     FROM device_ops WHERE job = ? GROUP BY ALL)
        SELECT b.trace_id, b.rank, b.busy_ns, b.compute_ns, b.communication_ns,
               {" + ".join(f"b.{c}" for c in BUCKETS)} AS buckets_ns, o.*
        FROM breakdown b JOIN ops o USING (trace_id, rank) WHERE b.job = ? AND b.step IS NULL""", [job, job])
    problems = []
    for r in rows.to_dicts():
        where = f"trace {r['trace_id'][:12]} rank {r['rank']}"
        if r["buckets_ns"] != r["busy_ns"]:
            problems.append(f"{where}: exclusive buckets add up to {r['buckets_ns']}, busy is {r['busy_ns']}")
        if not (r["busy_max"] or 0) <= r["busy_ns"] <= (r["busy_sum"] or 0):
            problems.append(f"{where}: busy {r['busy_ns']} outside [longest op {r['busy_max']}, "
                            f"sum of ops {r['busy_sum']}]")
        if r["compute_ns"] > r["compute_sum"] or r["communication_ns"] > r["comm_sum"]:
            problems.append(f"{where}: a union exceeds its ops' summed durations")
    steps = _frame(con, f"""SELECT trace_id, rank, step, busy_ns, {" + ".join(BUCKETS)} AS buckets_ns
                            FROM breakdown WHERE job = ? AND step IS NOT NULL""", [job])
    problems += [f"trace {r['trace_id'][:12]} rank {r['rank']} step {r['step']}: buckets {r['buckets_ns']} "
                 f"!= busy {r['busy_ns']}"
                 for r in steps.filter(pl.col("buckets_ns") != pl.col("busy_ns")).to_dicts()]
    return problems


def check_launches(wh: Warehouse, job: str, con: duckdb.DuckDBPyConnection) -> list[str]:
    """Launch time counted is at most the host's runtime-call time; launches at most the kernels.

    Runtime calls: host events of a runtime or driver category, or carrying a correlation id
    (XLA's launch threads), each counted once. Per trace: one host process may launch for
    several device ranks (XLA on GPU), and its calls are stored under one rank.
    """
    host = _frame(con, """
        WITH host AS (SELECT trace_id, sum(dur_ns) AS runtime_ns FROM host_ops
                      WHERE job = ? AND (regexp_matches(cat, ?) OR correlation IS NOT NULL) GROUP BY ALL)
        SELECT l.trace_id, sum(l.launch_overhead_ns) AS launch_overhead_ns, any_value(h.runtime_ns) AS runtime_ns
        FROM launch_stats l LEFT JOIN host h USING (trace_id) WHERE l.job = ? GROUP BY ALL""",
                  [job, RUNTIME_CAT, job])
    problems = [f"trace {r['trace_id'][:12]}: launch overhead {r['launch_overhead_ns']} ns counted, but runtime "
                f"calls take {r['runtime_ns'] or 0} ns in all"
                for r in host.to_dicts() if (r["launch_overhead_ns"] or 0) > (r["runtime_ns"] or 0)]
    rows = _frame(con, """
        WITH kernels AS (SELECT trace_id, rank, count(*) AS kernels FROM device_ops
                         WHERE job = ? AND kind = 'kernel' GROUP BY ALL)
        SELECT l.trace_id, l.rank, l.launches, l.shorter_than_launch, coalesce(k.kernels, 0) AS kernels
        FROM launch_stats l LEFT JOIN kernels k USING (trace_id, rank) WHERE l.job = ?""", [job, job])
    for r in rows.to_dicts():
        where = f"trace {r['trace_id'][:12]} rank {r['rank']}"
        if r["launches"] > r["kernels"]:
            problems.append(f"{where}: {r['launches']} launches joined, {r['kernels']} kernels")
        if (r["shorter_than_launch"] or 0) > r["launches"]:
            problems.append(f"{where}: {r['shorter_than_launch']} shorter than launch of {r['launches']}")
    return problems


#: Per table, the columns that are durations or counts.
_NON_NEGATIVE = {
    "device_ops": ("dur_ns", "bytes"), "host_ops": ("dur_ns",), "collectives": ("dur_ns", "cpu_dur_ns"),
    "steps": ("dur_ns", "device_op_count"),
    "traces": ("event_count", "device_op_count", "host_op_count", "collective_count", "step_count"),
    "breakdown": ("span_ns", "busy_ns", "idle_ns", "compute_ns", "communication_ns", "memory_ns",
                  "overlapped_communication_ns", "exposed_communication_ns", *BUCKETS),
    "kernel_stats": ("count", "total_ns", "mean_ns", "p50_ns", "p95_ns", "max_ns"),
    "stream_idle": ("ops", "op_ns", "gaps", "idle_ns", "host_wait_ns", "kernel_wait_ns", "other_ns"),
    "launch_stats": ("launches", "mean_delay_ns", "max_delay_ns", "shorter_than_launch", "launch_overhead_ns"),
    "stream_queues": ("launches", "max_queue", "mean_queue"),
}


def check_non_negative(wh: Warehouse, job: str, con: duckdb.DuckDBPyConnection) -> list[str]:
    """No negative duration or count in any table (a finding's gain: :func:`check_findings`)."""
    problems = []
    for table, columns in _NON_NEGATIVE.items():
        counts = con.sql(
            f"SELECT {', '.join(f'count(*) FILTER (WHERE {c} < 0)' for c in columns)} FROM {table} WHERE job = ?",
            params=[job]).fetchall()[0]
        problems += [f"{table}.{c}: {n} negative" for c, n in zip(columns, counts) if n]
    return problems  # findings' gains: check_findings


def check_nccl_kernels(wh: Warehouse, job: str, con: duckdb.DuckDBPyConnection) -> list[str]:
    """Every NCCL/RCCL kernel (by name) is the kernel of a collective of its trace and rank."""
    orphans = _frame(con, """
        SELECT d.trace_id, d.rank, count(*) AS kernels, any_value(d.name) AS example
        FROM device_ops d WHERE d.job = ? AND regexp_matches(d.name, ?)
          AND NOT EXISTS (SELECT 1 FROM collectives c WHERE c.job = d.job AND c.trace_id = d.trace_id
                          AND c.rank = d.rank AND c.kernel_event_id = d.event_id)
        GROUP BY ALL""", [job, NCCL_KERNEL])
    return [f"trace {r['trace_id'][:12]} rank {r['rank']}: {r['kernels']} NCCL kernels in no collective, "
            f"e.g. {r['example'][:60]}" for r in orphans.to_dicts()]


def check_categories(wh: Warehouse, job: str, con: duckdb.DuckDBPyConnection) -> list[str]:
    """Every device op has a known category, or its trace carries a warning."""
    unknown = _frame(con, f"""
        SELECT d.trace_id, count(*) AS ops, any_value(d.category) AS category
        FROM device_ops d JOIN traces t USING (trace_id)
        WHERE d.job = ? AND (d.category IS NULL OR d.category NOT IN ({", ".join(f"'{c}'" for c in KNOWN_CATEGORIES)}))
          AND coalesce(len(t.warnings), 0) = 0
        GROUP BY ALL""", [job])
    return [f"trace {r['trace_id'][:12]}: {r['ops']} device ops of category {r['category']!r}, and no warning"
            for r in unknown.to_dicts()]


def check_device_events_kept(wh: Warehouse, job: str, con: duckdb.DuckDBPyConnection) -> list[str]:
    """Each Kineto file's device events (counted in its raw JSON) are its device_ops rows, or it warns."""
    problems = []
    rows = _frame(con, """SELECT t.trace_id, t.source_path, t.warnings,
                                 (SELECT count(*) FROM device_ops d WHERE d.trace_id = t.trace_id) AS ops
                          FROM traces t WHERE t.job = ? AND t.format = 'pytorch_profiler'""", [job])
    for r in rows.to_dicts():
        raw = _raw_device_events(Path(r["source_path"])) if r["source_path"] else None
        if raw is not None and raw != r["ops"] and not r["warnings"]:
            problems.append(f"trace {r['trace_id'][:12]} ({Path(r['source_path']).name}): {raw} device events in "
                            f"the file, {r['ops']} device ops, and no warning")
    return problems


def check_critical_path(wh: Warehouse, job: str, con: duckdb.DuckDBPyConnection) -> list[str]:
    """Each step's critical path (docs/analyses.md, "Critical path") replays the step it was measured on.

    The measured length is taken independently: per run, the span of every host event (Python frames
    left out) and device op (syncs left out) of the step, across ranks, in SQL. The replay of the
    unchanged graph is within 2% of it; the time by kind adds up to the replayed length; the stretches
    follow each other without gaps or overlaps; and no what-if that only shortens durations predicts a
    longer step, none a negative one.
    """
    a = _analysis(wh, job)
    problems: list[str] = []
    runs = a.runs.select("run", "trace_ids").rows() if "trace_ids" in a.runs.columns else []
    multi = "run" in a.critical_path.columns
    for run, trace_ids in runs or [(None, None)]:
        where = "job = ?" + (" AND trace_id IN (SELECT unnest(?))" if trace_ids else "")
        params: list[object] = [job, trace_ids] if trace_ids else [job]
        events = f"""SELECT step, ts_ns AS s, ts_ns + coalesce(dur_ns, 0) AS e FROM host_ops
                     WHERE {where} AND ts_ns IS NOT NULL AND cat <> 'python_function'
                     UNION ALL SELECT step, ts_ns, ts_ns + coalesce(dur_ns, 0) FROM device_ops
                     WHERE {where} AND ts_ns IS NOT NULL AND category <> 'sync'"""
        sql = f"""WITH ev AS ({events}), stepped AS (SELECT count(*) AS n FROM ev WHERE step IS NOT NULL)
                  SELECT CASE WHEN (SELECT n FROM stepped) > 0 THEN step END AS step, max(e) - min(s) AS ns
                  FROM ev WHERE (SELECT n FROM stepped) = 0 OR step IS NOT NULL GROUP BY 1"""
        expected = dict(_frame(con, sql, params * 2).rows())
        mine = a.critical_path.filter(pl.col("run") == run) if multi and run else a.critical_path
        got = {row["step"]: row for row in mine.iter_rows(named=True)}
        if set(got) != set(expected):
            problems.append(f"run {run}: steps {sorted(got, key=str)} replayed, {sorted(expected, key=str)} measured")
        for step, row in got.items():
            span = expected.get(step)
            if span is not None and row["measured_ns"] != span:
                problems.append(f"run {run} step {step}: measured {row['measured_ns']} ns, the events span {span} ns")
            if abs(row["length_ns"] - row["measured_ns"]) > 0.02 * row["measured_ns"]:
                problems.append(f"run {run} step {step}: replay {row['length_ns']} ns vs {row['measured_ns']} ns")
            kinds = sum(row[f"{k}_ns"] for k in PATH_KINDS)
            if kinds != row["length_ns"]:
                problems.append(f"run {run} step {step}: kinds add up to {kinds} ns, the path is {row['length_ns']}")
        stretches = (a.critical_path_stretches.filter(pl.col("run") == run) if multi and run
                     else a.critical_path_stretches)
        for (step,), part in stretches.group_by("step"):
            part = part.sort("position")
            starts, durs = part["start_ns"].to_list(), part["dur_ns"].to_list()
            if any(d < 0 for d in durs) or any(starts[i] + durs[i] != starts[i + 1] for i in range(len(starts) - 1)):
                problems.append(f"run {run} step {step}: stretches leave gaps or overlap")
            if step in got and sum(durs) != got[step]["length_ns"]:
                problems.append(f"run {run} step {step}: stretches add up to {sum(durs)}, not {got[step]['length_ns']}")
        what = a.what_if.filter(pl.col("run") == run) if multi and run else a.what_if
        shrinks = ~pl.col("scenario").is_in(list(GROWING))
        bad = what.filter(((pl.col("predicted_ns") > pl.col("measured_ns")) & shrinks) | (pl.col("predicted_ns") < 0))
        for row in bad.iter_rows(named=True):
            problems.append(f"run {run} step {row['step']}: {row['scenario']} predicts {row['predicted_ns']} ns "
                            f"against {row['measured_ns']} ns measured")
    return problems


INVARIANTS: dict[str, Callable[[Warehouse, str, duckdb.DuckDBPyConnection], list[str]]] = {
    "findings_bounded_and_named": check_findings,
    "busy_plus_idle_is_span": check_busy_idle_span,
    "buckets_sum_to_busy": check_buckets,
    "launch_within_host_time": check_launches,
    "no_negative_durations_or_counts": check_non_negative,
    "nccl_kernels_in_collectives": check_nccl_kernels,
    "known_categories": check_categories,
    "device_events_kept": check_device_events_kept,
    "critical_path_replays_the_steps": check_critical_path,
}


def violations(wh: Warehouse, job: str, only: str | None = None) -> dict[str, list[str]]:
    """What breaks each invariant (or only the one named) on ``job``; empty lists where they hold."""
    con = wh.connect()
    try:
        return {name: check(wh, job, con) for name, check in INVARIANTS.items() if only in (None, name)}
    finally:
        con.close()


# -- every real and sample trace ------------------------------------------------------------------------


class _Checked:
    """The jobs of :data:`JOBS` in one warehouse, each ingested and checked once, on first use.

    On first use, so that a run which selects only some jobs (``-m "not slow"`` leaves the real
    traces out) ingests only those.
    """

    def __init__(self, home: Path) -> None:
        self.warehouse = Warehouse(home)
        self._errors: dict[str, str | None] = {}
        self._found: dict[str, dict[str, list[str]]] = {}

    def error(self, job: str) -> str | None:
        """Why ``job`` did not ingest (its files' errors); None where it did."""
        if job not in self._errors:
            report = self.warehouse.ingest(JOBS[job], job=job)
            self._errors[job] = None if report.ok else "; ".join(f"{r.path.name}: {r.error}" for r in report.failed)
        return self._errors[job]

    def violations(self, job: str) -> dict[str, list[str]]:
        if job not in self._found:
            self._found[job] = violations(self.warehouse, job)
        return self._found[job]


@pytest.fixture(scope="module")
def checked(tmp_path_factory: pytest.TempPathFactory) -> _Checked:
    """Every real and sample trace ingested, one job each."""
    return _Checked(tmp_path_factory.mktemp("invariants") / "warehouse")


@pytest.mark.parametrize("invariant", list(INVARIANTS))
@pytest.mark.parametrize("job", [pytest.param(job, marks=pytest.mark.slow) if job.startswith("real_") else job
                                 for job in JOBS])
def test_trace_invariant(checked: _Checked, job: str, invariant: str) -> None:
    error = checked.error(job)
    assert error is None, f"{job} did not ingest: {error}"
    assert checked.violations(job)[invariant] == [], f"{job} ({JOBS[job][0]}): {invariant}"


def test_every_real_trace_folder_is_a_job() -> None:
    if not REAL_TRACES.is_dir():
        pytest.skip("../shared/real_traces is not present")
    folders = [p for p in (REAL_TRACES / "pytorch_profiler").iterdir() if p.is_dir()]
    xla = list((REAL_TRACES / "xla").iterdir())
    assert len([j for j in JOBS if j.startswith("real_")]) == len(folders) + len(xla) + 1


# -- the same invariants on generated traces ------------------------------------------------------------


@st.composite
def scenarios(draw: st.DrawFn) -> generate.Scenario:
    """Small Kineto scenarios: 1-3 ranks, 1-3 steps, a few layers, with or without a straggler."""
    ranks = draw(st.integers(1, 3))
    straggler = draw(st.none() | st.integers(0, ranks - 1)) if ranks > 1 else None
    return generate.Scenario(
        name="generated", ranks=ranks, steps=draw(st.integers(1, 3)), layers=draw(st.integers(1, 6)),
        straggler_rank=straggler, straggler_delay_us=draw(st.sampled_from([0.0, 50.0, 400.0])),
        launch_bound=draw(st.booleans()), seed=draw(st.integers(0, 2**31)),
        straggler_slowdown=draw(st.sampled_from([1.0, 1.5])), buckets=draw(st.integers(1, 3)),
        first_step=draw(st.integers(0, 5)), busbw_gbps=draw(st.sampled_from([20.0, 150.0])),
    )


def _assert_holds(wh: Warehouse, job: str) -> None:
    broken = {name: found for name, found in violations(wh, job).items() if found}
    assert broken == {}


@pytest.mark.slow  # generates and ingests multi-rank traces
@settings(max_examples=6, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(scenarios())
def test_generated_kineto_invariants(scenario: generate.Scenario) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        summaries = [generate.write_trace(Path(tmp) / "in" / f"rank-{r}.json.gz", scenario, r)
                     for r in range(scenario.ranks)]
        wh = Warehouse(Path(tmp) / "warehouse")
        assert wh.ingest([Path(tmp) / "in"], job="gen").ok
        _assert_holds(wh, "gen")
        # The generator's own counts: every device op and NCCL kernel it wrote arrives, each kernel linked.
        with wh.connect() as con:
            got = dict(con.sql("SELECT rank, count(*) FROM device_ops GROUP BY rank").fetchall())
            nccl = dict(con.sql("SELECT rank, count(*) FROM collectives WHERE kernel_event_id IS NOT NULL "
                                "GROUP BY rank").fetchall())
        for s in summaries:
            assert got.get(s["rank"], 0) == sum(s["device_ops"].values()), s
            assert nccl.get(s["rank"], 0) == s["nccl_kernels"], s


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(1, 3), st.integers(0, 12), st.booleans())
def test_generated_xla_invariants(steps: int, extra: int, gpu: bool) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "in" / "host0.xplane.pb"
        path.parent.mkdir()
        path.write_bytes(generate_xla.build_gpu(steps, kernels=extra, gpus=2) if gpu
                         else generate_xla.build(steps, small_ops=extra))
        wh = Warehouse(Path(tmp) / "warehouse")
        assert wh.ingest([path], job="gen").ok
        _assert_holds(wh, "gen")
