"""Typed settings, read from the environment (prefix ``TRACELAKE_``) in one place."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path

from .errors import InvalidArgument


@dataclass(frozen=True)
class Settings:
    """Everything tracelake can be configured with.

    Each field is read from ``TRACELAKE_<FIELD NAME IN CAPITALS>``; the CLI's options
    override the environment.
    """

    #: Warehouse directory: Parquet tables, the DuckDB catalog, staging area.
    home: Path = Path("~/.tracelake")
    #: Memory DuckDB may use while normalising one trace at ingest (DuckDB size string).
    ingest_memory_limit: str = "200MB"
    #: Threads DuckDB uses per ingest and per query connection.
    threads: int = 2
    #: Bytes of JSON decoded per batch while streaming a trace; bounds parser memory.
    parse_batch_bytes: int = 8 << 20
    #: Bus bandwidth each link type carries at best, GB/s per GPU, over the defaults: ``nvlink=450,ib=50``.
    link_peaks: str = ""

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: object) -> Settings:
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
        if "home" in values:
            values["home"] = Path(str(values["home"]))
        return cls(**values)  # type: ignore[arg-type]

    @property
    def home_path(self) -> Path:
        """The warehouse directory, absolute, with ``~`` expanded."""
        return self.home.expanduser().resolve()


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
    "threads": "DuckDB threads per ingest and per query (default 2).",
    "parse_batch_bytes": "Bytes of JSON decoded per batch while streaming a trace (default 8 MiB).",
    "link_peaks": "Bus bandwidth per link type, GB/s, e.g. `nvlink=450,pcie=50,ib=50,socket=12.5` (the defaults).",
}
