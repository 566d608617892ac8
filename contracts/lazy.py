"""Modules loaded on first use: what an ingest's process does not need until its stored analyses.

An ingest parses a trace with DuckDB, Arrow and the native scanners; polars and the analyses
(:mod:`tracelake.analysis`) come in only for the stored analyses at its end. Loaded at import
they held 24-26 MiB of the process's memory through every step of the parse, which is where an
ingest's peak is (docs/architecture.md, "Memory"). So the modules on the ingest's path (the
facade's, the store's, the NCCL log parser's, the CLI's) take polars from here::

    from tracelake.contracts.lazy import polars as pl

and name an analysis module through :func:`lazy_module`, beside a ``TYPE_CHECKING`` import of it. DuckDB likewise
(``from tracelake.contracts.lazy import duckdb``): parsing an XLA profile or an NCCL output and opening a warehouse
whose catalog is current use none of it, and its import held 14 MiB through the whole ingest; Kineto traces are
parsed with it, a catalog is written with it, queries run on it. And Arrow's datasets (``from
tracelake.contracts.lazy import pyarrow_dataset as ds``): a warehouse reads several traces' files through one, but
no ingest does, and importing it loads Arrow's query engine, file systems and formats, 15 MB of the process's
memory (its own and its libraries' pages). The optional C extensions are imported through
:func:`optional_module`.
The type checker sees the modules themselves; at run time a stand-in imports its module when
one of its attributes is first read. ``tests/test_lazy_imports.py`` checks that opening a
warehouse and parsing each format but the NCCL debug log (whose parser is written in polars)
loads neither. This module imports nothing of the project's.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import TYPE_CHECKING, Any


class LazyModule:
    """Stands for the module ``name``, imported when one of its attributes is first read.

    Python's import lock makes the first read from two threads at once import it once; the module is
    kept after that, so a read costs one Python call more than the module's own (per batch of work,
    not per row, where the project reads them).
    """

    __slots__ = ("_name", "_module")

    def __init__(self, name: str) -> None:
        self._name = name
        self._module: ModuleType | None = None

    def __getattr__(self, attribute: str) -> Any:
        module = self._module
        if module is None:
            module = self._module = importlib.import_module(self._name)
        return getattr(module, attribute)

    def __repr__(self) -> str:
        state = "loaded" if self._module is not None else "not loaded yet"
        return f"<lazy module {self._name!r}, {state}>"


def optional_module(name: str) -> ModuleType | None:
    """The module ``name`` where it can be imported, else None: a C extension the install may not have built (no
    compiler there), beside which its caller keeps a Python twin."""
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def lazy_module(name: str) -> Any:
    """A stand-in for the module ``name`` that imports it on first use (typed ``Any``: the module's own type is
    what ``TYPE_CHECKING`` imports give the type checker)."""
    return LazyModule(name)


if TYPE_CHECKING:
    import duckdb as duckdb
    import polars as polars
    import pyarrow.dataset as pyarrow_dataset
else:
    duckdb = lazy_module("duckdb")
    polars = lazy_module("polars")
    pyarrow_dataset = lazy_module("pyarrow.dataset")
