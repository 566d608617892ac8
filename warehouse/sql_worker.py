"""A SQL worker process: confines itself (:mod:`.sql_sandbox`), then runs queries one at a time.

Started by :mod:`.sql_pool` as ``python -I -B -m tracelake.warehouse.sql_worker``. Its first
line on stdin is its configuration (JSON); before it reads any query it closes the
sandbox: Landlock (read only beneath the folders named, write nowhere but a scratch
folder, no TCP, no signals out), no file may grow, and its data segment capped at
its idle size plus the memory limit. The environment it gets holds no tokens.

Then, per request line (JSON), it answers on stdout in frames (one kind byte, a
4-byte big-endian length, the payload):

* ``H`` the head, ``{"columns": [...], "types": [...]}``;
* ``D`` rows: JSON arrays separated by commas (the caller puts the brackets around);
* ``E`` the end, ``{"row_count", "truncated", "truncated_by", "recycle"}``;
* ``X`` an error, ``{"kind": "refused" | "query" | "memory" | "timeout", "error", "recycle"}``.

With ``hold``, the whole answer (at most ``max_bytes``) is computed before the head goes
out, so an error always comes instead of a head, never after rows were sent.
"""

from __future__ import annotations

import json
import os
import struct
import sys
import threading
from typing import IO, Any

from . import sql_sandbox

#: Rows fetched from DuckDB at a time, and the size at which a rows frame is sent.
_FETCH_ROWS = 2048
_FRAME_BYTES = 256 << 10
#: The most bytes of rows one frame carries (a long row is split; the pool refuses larger frames).
_MAX_PIECE = 1 << 20
#: The longest error message passed on (DuckDB's messages may quote the whole query).
_MAX_MESSAGE = 16 << 10
#: A worker whose resident size grew this much past its idle size is replaced after its query.
_RECYCLE_GROWTH = 128 << 20


def main() -> None:
    """Read the configuration, close the sandbox, answer requests until stdin ends."""
    out = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)  # a stray print goes to stderr, never into the frames
    config = json.loads(sys.stdin.readline() or "{}")
    try:
        db, ready = _confine(config)
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which refuses to use this worker
        _send(out, b"X", {"kind": "sandbox", "error": f"cannot start the SQL sandbox: {exc}", "recycle": True})
        return
    try:
        _send(out, b"R", ready)
        worker = _Worker(config, db, out)
        for line in sys.stdin:
            if line.strip() and not worker.answer(json.loads(line)):
                return
    except BrokenPipeError:  # the server let go of this worker
        return


def _confine(config: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """Close the sandbox, then open the database every query of this worker reads through."""
    # Everything the worker runs is imported first (none of it starts a thread); DuckDB's
    # threads start with the first connection, inside the sandbox.
    import duckdb
    import msgspec  # noqa: F401

    from . import sql_policy  # noqa: F401

    threads = sql_sandbox.threads()
    if threads != 1:
        raise sql_sandbox.SandboxError(f"{threads} threads before the sandbox closed (Landlock needs one)")
    scratch = [os.fspath(p) for p in config.get("scratch") or []]
    if not scratch:
        sql_sandbox.no_files_grow()
    from pathlib import Path

    read = [Path(p) for p in config.get("read") or []] + sql_sandbox.runtime_paths()
    abi = sql_sandbox.restrict(read, [Path(p) for p in scratch])
    if abi == 0 and config.get("require_landlock"):
        raise sql_sandbox.SandboxError("this kernel has no Landlock (Linux 5.13+ with landlock in its LSMs)")
    db = duckdb.connect(config={"threads": int(config.get("threads") or 1)})
    for statement in _settings(config):
        db.execute(statement)
    db.execute("SELECT 1").fetchall()
    memory = config.get("memory_bytes")
    # Thread stacks are data too: the query's DuckDB threads and its timer get theirs on top.
    stacks = (int(config.get("threads") or 1) + 2) * sql_sandbox.stack_bytes()
    cap = sql_sandbox.limit_memory(int(memory) + stacks) if memory else 0
    return db, {"landlock": abi, "memory_cap": cap, "pid": os.getpid(), "rss": _rss()}


def _settings(config: dict[str, Any]) -> list[str]:
    """The warehouse's views, then DuckDB's own limits, locked: no query can change them."""
    memory = config.get("duckdb_memory")
    statements = [f"SET memory_limit = '{int(memory)}B'"] if memory else []
    statements += [
        "SET temp_directory = ''",  # nothing spills: the memory limit is a cap, and nothing is written
        "SET autoinstall_known_extensions = false",
        "SET autoload_known_extensions = false",
        "SET allow_persistent_secrets = false",
        "SET home_directory = '/nonexistent/tracelake-sql'",
        "SET secret_directory = '/nonexistent/tracelake-sql'",
        "SET extension_directory = '/nonexistent/tracelake-sql'",
        *(config.get("views") or []),
    ]
    allowed = config.get("allowed_directories")
    if allowed is not None:  # last: with external access off, the settings above can no longer change
        listed = ", ".join("'" + str(p).replace("'", "''") + "'" for p in allowed)
        statements += [f"SET allowed_directories = [{listed}]", "SET enable_external_access = false"]
    if config.get("lock", True):
        statements.append("SET lock_configuration = true")
    return statements


class _Worker:
    """Answers requests, each on a connection of its own to the worker's one database."""

    def __init__(self, config: dict[str, Any], db: Any, out: IO[bytes]) -> None:
        import msgspec

        from . import sql_policy

        self.config = config
        self.db = db
        self.out = out
        self.policy = sql_policy
        self.encoder = msgspec.json.Encoder(enc_hook=str, decimal_format="number")
        self.idle_rss = _rss()
        self._recycle = False

    def answer(self, request: dict[str, Any]) -> bool:
        """Run one request; False when this worker should exit (it says so in its last frame)."""
        import duckdb

        from tracelake.contracts.errors import QueryError

        fired = threading.Event()
        timer: threading.Timer | None = None
        con = self.db.cursor()
        try:
            query, explain = self._checked(con, request)
            timeout = request.get("timeout")
            if timeout:
                def cancel() -> None:
                    fired.set()
                    con.interrupt()

                timer = threading.Timer(float(timeout), cancel)
                timer.daemon = True
                timer.start()
            self._run(con, f"EXPLAIN {query}" if explain else query, request)
        except QueryError as exc:
            self._error("refused", str(exc), False)
        except duckdb.OutOfMemoryException as exc:
            self._error("memory", str(exc).strip().splitlines()[0], True)
        except MemoryError:
            self._error("memory", "out of memory", True)
        except RuntimeError as exc:  # "can't start new thread": no memory left for a thread's stack
            self._error("memory", str(exc), True)
        except duckdb.Error as exc:
            if fired.is_set():
                self._error("timeout", f"the query ran past {request.get('timeout'):g} s", True)
            else:
                self._error("query", str(exc).strip(), False)
        finally:
            if timer is not None:
                timer.cancel()
            con.close()
        return not self._recycle

    def _checked(self, con: Any, request: dict[str, Any]) -> tuple[str, bool]:
        if not request.get("check", True):
            return str(request["sql"]), False
        query, explain = self.policy.single_query(str(request["sql"]))
        self.policy.check_tree(con, query, self.policy.Policy.from_dict(request["policy"]))
        return query, explain

    def _run(self, con: Any, query: str, request: dict[str, Any]) -> None:
        copy_to = request.get("copy_to")
        if copy_to:
            path = str(copy_to["path"]).replace("'", "''")
            row = con.execute(f"COPY (\n{query}\n) TO '{path}' (FORMAT {copy_to['format']})").fetchone()
            self._send_head([], [])
            self._end(int(row[0]) if row else 0, None)
            return
        result = con.execute(query)
        description = result.description or []
        columns, types = [str(d[0]) for d in description], [str(d[1]) for d in description]
        max_rows, max_bytes = request.get("max_rows"), request.get("max_bytes")
        hold = bool(request.get("hold"))
        held: list[bytes] = []
        if not hold:
            self._send_head(columns, types)
        chunk, count, size, cut = bytearray(), 0, 0, None
        while cut is None:
            rows = result.fetchmany(_FETCH_ROWS)
            if not rows:
                break
            for row in rows:
                if max_rows is not None and count >= max_rows:
                    cut = "rows"
                    break
                encoded = self._encode(row)
                if max_bytes is not None and size + len(encoded) + 1 > max_bytes:
                    cut = "bytes"
                    break
                if count:
                    chunk += b","
                chunk += encoded
                size += len(encoded) + 1
                count += 1
                if len(chunk) >= _FRAME_BYTES:
                    self._rows(bytes(chunk), held if hold else None)
                    chunk = bytearray()
        if chunk:
            self._rows(bytes(chunk), held if hold else None)
        if hold:
            self._send_head(columns, types)
            for piece in held:
                _frame(self.out, b"D", piece)
        self._end(count, cut)

    def _rows(self, chunk: bytes, held: list[bytes] | None) -> None:
        """Send rows now, or keep them in ``held`` until the whole answer is known (frames of at most 1 MiB)."""
        for start in range(0, len(chunk), _MAX_PIECE):
            piece = chunk[start : start + _MAX_PIECE]
            if held is None:
                _frame(self.out, b"D", piece)
            else:
                held.append(piece)

    def _encode(self, row: tuple[Any, ...]) -> bytes:
        try:
            return bytes(self.encoder.encode(list(row)))
        except (TypeError, ValueError, OverflowError):  # a value msgspec cannot take: its text
            return bytes(self.encoder.encode([v if _plain(v) else str(v) for v in row]))

    def _send_head(self, columns: list[str], types: list[str]) -> None:
        head = json.dumps({"columns": columns, "types": types}).encode()
        if len(head) > _MAX_PIECE:
            from tracelake.contracts.errors import QueryError

            raise QueryError(f"the answer's column names and types take {len(head):,} bytes: at most "
                             f"{_MAX_PIECE:,} can be sent")
        _frame(self.out, b"H", head)

    def _end(self, count: int, cut: str | None) -> None:
        self._recycle = _rss() - self.idle_rss > _RECYCLE_GROWTH
        _send(self.out, b"E", {"row_count": count, "truncated": cut is not None, "truncated_by": cut,
                               "recycle": self._recycle})

    def _error(self, kind: str, message: str, recycle: bool) -> None:
        self._recycle = recycle or _rss() - self.idle_rss > _RECYCLE_GROWTH
        if len(message) > _MAX_MESSAGE:
            message = message[:_MAX_MESSAGE] + " [...]"
        _send(self.out, b"X", {"kind": kind, "error": message, "recycle": self._recycle})


def _plain(value: Any) -> bool:
    return value is None or isinstance(value, bool | int | float | str)


def _send(out: IO[bytes], kind: bytes, payload: dict[str, Any]) -> None:
    _frame(out, kind, json.dumps(payload).encode())


def _frame(out: IO[bytes], kind: bytes, payload: bytes) -> None:
    out.write(kind + struct.pack(">I", len(payload)) + payload)


def _rss() -> int:
    try:
        with open("/proc/self/statm", encoding="ascii") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


if __name__ == "__main__":
    main()
