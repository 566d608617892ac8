"""Typed settings, read from the environment (prefix ``TRACELAKE_``) in one place."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Self

from tracelake.analysis import peaks
from tracelake.contracts.errors import InvalidArgument


@dataclass(frozen=True)
class Settings:
    """Everything the warehouse can be configured with.

    Each field is read from ``TRACELAKE_<FIELD NAME IN CAPITALS>``; the CLI's options
    override the environment. What only the server reads (API tokens, upload and
    connection limits, ingest workers, the report schedule) is added by
    :class:`tracelake.api.settings.ServerSettings`, a subclass read the same way.
    """

    #: Warehouse directory: Parquet tables, the DuckDB catalog, staging area.
    home: Path = Path("~/.tracelake")
    #: Memory DuckDB may use while normalising one trace at ingest (DuckDB size string).
    ingest_memory_limit: str = "200MB"
    #: Threads DuckDB uses per ingest and per query connection; the NCCL log parser's scan threads (at most 4).
    threads: int = 2
    #: Bytes of JSON decoded per batch while streaming a trace; bounds parser memory.
    parse_batch_bytes: int = 8 << 20
    #: How Kineto JSON events are read: ``auto`` (the native scanner where it is built), ``native``, ``duckdb``.
    kineto_engine: str = "auto"
    #: How NCCL debug logs' COLL lines are read: ``auto`` (the native scanner where it is built), ``native``, ``polars``.
    nccl_log_engine: str = "auto"
    #: Bus bandwidth a link carries at best, GB/s per rank, by link or family: ``nvlink3=260,ib=400``.
    link_peaks: str = ""
    #: Device peaks over the built-in table: ``H100 PCIe: bf16=756, hbm=2.0; fp8=1979`` (TFLOP/s, TB/s).
    device_peaks: str = ""
    #: Most bytes an uploaded archive or gzip file may expand to, in all.
    max_expanded_bytes: int = 32 << 30
    #: Most an uploaded archive or gzip file may expand relative to its size (zip and gzip bombs).
    max_expansion_ratio: int = 200
    #: Seconds an API SQL query may run before it is cancelled.
    sql_timeout_seconds: int = 30
    #: Most rows an API SQL query returns (the answer says when it was cut).
    sql_max_rows: int = 10_000
    #: Memory one SQL query's worker process may map beyond its idle size, enforced by the OS (RLIMIT_AS).
    sql_memory_limit: str = "1GB"
    #: Bytes of rows one API SQL answer may carry (JSON); the answer says when it was cut.
    sql_max_bytes: int = 64 << 20
    #: Worker processes API SQL queries run in, one query each at a time (their own bounded pool).
    sql_workers: int = 3
    #: API SQL queries one token may have running or waiting at once; more are answered 429.
    sql_per_token: int = 8
    #: Seconds an API SQL query may wait for a free worker before it is answered 503.
    sql_queue_seconds: int = 10
    #: ``required``: API SQL runs only where the kernel confines its workers (Landlock); ``optional``: anywhere.
    sql_os_sandbox: str = "required"

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: object) -> Self:
        """Build settings from ``environ`` (default: ``os.environ``), then ``overrides``.

        Overrides that are ``None`` are ignored, so CLI options can be passed through as they are.
        """
        env = os.environ if environ is None else environ
        values: dict[str, object] = {}
        for f in fields(cls):
            raw = env.get(f"TRACELAKE_{f.name.upper()}")
            if raw is not None and raw != "":
                values[f.name] = _convert(f.name, raw, f.type)
        values.update({k: v for k, v in overrides.items() if v is not None})
        for name, allowed in (("kineto_engine", KINETO_ENGINES), ("nccl_log_engine", NCCL_LOG_ENGINES)):
            engine = values.get(name, "auto")
            if engine not in allowed:
                raise InvalidArgument(f"TRACELAKE_{name.upper()}={engine!r}: choose one of {', '.join(allowed)}")
        sandbox = values.get("sql_os_sandbox", "required")
        if sandbox not in OS_SANDBOX:
            raise InvalidArgument(f"TRACELAKE_SQL_OS_SANDBOX={sandbox!r}: choose one of {', '.join(OS_SANDBOX)}")
        try:  # a mistake is an error now, not at the first ingest
            peaks.parse_overrides(str(values.get("device_peaks", "")))
        except InvalidArgument as exc:
            raise InvalidArgument(f"TRACELAKE_DEVICE_PEAKS: {exc}") from None
        if "home" in values:
            values["home"] = Path(str(values["home"]))
        return cls(**values)  # type: ignore[arg-type]

    def base(self) -> Settings:
        """Only the warehouse's settings (a subclass's additions, such as API tokens, dropped): what workers get."""
        if type(self) is Settings:
            return self
        return Settings(**{f.name: getattr(self, f.name) for f in fields(Settings)})

    @property
    def home_path(self) -> Path:
        """The warehouse directory, absolute, with ``~`` expanded."""
        return self.home.expanduser().resolve()


#: Values of ``kineto_engine``.
KINETO_ENGINES = ("auto", "native", "duckdb")
#: Values of ``nccl_log_engine``.
NCCL_LOG_ENGINES = ("auto", "native", "polars")
#: Values of ``sql_os_sandbox``.
OS_SANDBOX = ("required", "optional")


def _convert(name: str, raw: str, type_: object) -> object:
    if type_ in (int, "int"):
        try:
            return int(raw)
        except ValueError:
            raise InvalidArgument(f"TRACELAKE_{name.upper()}={raw!r} is not a whole number") from None
    if type_ in (Path, "Path"):
        return Path(raw)
    return raw


#: One line per setting, for the docs and `--help` texts.
SETTINGS_DOC: dict[str, str] = {
    "home": "Warehouse directory (default `~/.tracelake`); `--home` overrides it.",
    "ingest_memory_limit": "DuckDB memory limit while normalising one trace (default `200MB`; it spills to disk past it).",
    "threads": "DuckDB threads per ingest and per query (default 2); the NCCL debug log parser also scans its "
    "chunks on this many threads (at most 4).",
    "parse_batch_bytes": "Bytes of JSON decoded per batch while streaming a trace (default 8 MiB).",
    "kineto_engine": "How PyTorch profiler events are read: `auto` (the default: tracelake's native scanner, "
    "built at install where gcc and the Python headers are present, else DuckDB's JSON reader), `native` "
    "(fail where it is not built) or `duckdb` (the reference reader, about half the speed).",
    "nccl_log_engine": "How NCCL debug logs' COLL lines are read: `auto` (the default: tracelake's native scanner, "
    "built at install where gcc and the Python headers are present, else polars), `native` (fail where it is not "
    "built) or `polars` (the reference, about half the speed).",
    "link_peaks": "Bus bandwidth per rank, GB/s, by link (`nvlink3=260`) or family (`nvlink`, `pcie`, `xgmi`, `ib`, "
                  "`roce`, `efa`, `socket`), over the per-GPU table of docs/analyses.md (\"Link peaks\").",
    "device_peaks": "Dense peaks of a device over the built-in table (docs/analyses.md, \"Hardware peaks\"): "
                    "entries split by `;`, each an optional device-name pattern and `:`, then dtypes in TFLOP/s "
                    "and `hbm` in TB/s, e.g. `H100 PCIe: bf16=756, hbm=2.0`. Applied at ingest; `tracelake analyze "
                    "--recompute` applies a change to stored traces.",
    "max_expanded_bytes": "Most bytes an uploaded archive or gzip file may expand to (default 32 GiB).",
    "max_expansion_ratio": "Most an uploaded archive or gzip file may expand per byte uploaded (default 200).",
    "sql_timeout_seconds": "Seconds an API SQL query may run before it is cancelled (default 30).",
    "sql_max_rows": "Most rows an API SQL query returns; the answer says when rows were cut (default 10,000).",
    "sql_memory_limit": "Memory the worker process of one SQL query may map beyond its idle size (default `1GB`), "
    "enforced by the operating system (`RLIMIT_AS`); DuckDB's own limit is set below it. A query past it gets a 400.",
    "sql_max_bytes": "Most bytes of rows one SQL answer carries, as JSON (default 64 MiB); the answer says when it was cut.",
    "sql_workers": "Worker processes that run SQL queries, one query each at a time (default 3; each holds about "
    "70 MB idle and at most `sql_memory_limit` more while it runs a query).",
    "sql_per_token": "SQL queries one API token may have running or waiting at once (default 8); more are answered "
    "429. One token runs at most `sql_workers` - 1 at a time, so another client always finds a worker.",
    "sql_queue_seconds": "Seconds a SQL query waits for a free worker before it is answered 503 (default 10).",
    "sql_os_sandbox": "`required` (the default): the API runs SQL only where the kernel can confine its worker "
    "processes (Landlock, Linux 5.13+), else answers 503; `optional`: without that wall where the kernel lacks it.",
}
