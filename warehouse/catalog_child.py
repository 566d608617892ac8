"""Runs DuckDB statements for :func:`tracelake.warehouse.catalog.write_catalog` in a short-lived process.

Started as ``python -P -B catalog_child.py`` (the file by its path, so no tracelake package is imported)
by a process that has not loaded DuckDB: loading it maps some 40 MB of its library into a process, for
good, and writing the catalog is all an XLA or NCCL ingest into a new warehouse would load it for.
Reads a JSON list of statements on stdin and runs them in order on one in-memory connection; on an
error, prints DuckDB's message (its first line) on stderr and exits with status 1. Imports nothing but the standard
library and DuckDB.
"""

from __future__ import annotations

import json
import sys


def main() -> int:
    """Run the statements read from stdin; 0 when all ran, else 1 with the error on stderr."""
    statements = json.load(sys.stdin)
    import duckdb

    con = duckdb.connect()
    try:
        for statement in statements:
            con.execute(statement)
    except duckdb.Error as exc:
        first = (str(exc).splitlines() or [""])[0]  # DuckDB's next lines point into the statement
        print(f"{type(exc).__name__}: {first}", file=sys.stderr)
        return 1
    finally:
        con.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
