"""The server's settings: the warehouse's :class:`~tracelake.warehouse.Settings` plus what only ``tracelake serve`` reads.

API tokens, upload limits, connection limits, ingest workers and the report schedule are
read from the environment like every setting (``TRACELAKE_<FIELD NAME IN CAPITALS>``, by the
same :meth:`~tracelake.warehouse.Settings.from_env`), but only the faces use them, so they are
declared here rather than in the warehouse. A :class:`ServerSettings` is a ``Settings``: the
server hands it to its :class:`~tracelake.warehouse.Warehouse` as it is.

Regenerate the table in docs/api.md ("Server settings") with ``python -m tracelake.api.settings``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from tracelake.warehouse import Settings


@dataclass(frozen=True)
class ServerSettings(Settings):
    """Everything ``tracelake serve`` can be configured with: the warehouse's settings and the server's own."""

    #: API bearer tokens and their scopes: ``ci-uploader-7f3a:read,write;dashboard-9c2e:read`` (scopes: read, write, admin).
    tokens: str = ""
    #: A file of API tokens, one ``token:scopes`` per line (``#`` starts a comment).
    tokens_file: str = ""
    #: Largest file one upload may carry, bytes.
    max_file_bytes: int = 4 << 30
    #: Largest request body an upload may send, bytes (every file of it together).
    max_request_bytes: int = 8 << 30
    #: Most members an uploaded archive may hold.
    max_archive_members: int = 10_000
    #: Processes the server ingests uploads with, side by side.
    ingest_workers: int = 1
    #: Seconds an upload's body may send nothing before the upload is cut off (408): stalled clients.
    upload_idle_timeout_seconds: int = 60
    #: Seconds a client has to send a request's headers before the connection is closed (408): slow clients.
    header_timeout_seconds: int = 30
    #: Seconds one upload request may take from its first byte to its last, however steadily it sends (408).
    upload_deadline_seconds: int = 3600
    #: Connections the server holds open at once; past it, the longest idle one (no request in progress) is closed.
    max_connections: int = 1000
    #: When ``tracelake serve`` writes the fleet report into ``reports/``: cron syntax (``0 6 * * MON``); empty: never.
    report_schedule: str = ""
    #: Time zone of the report schedule's wall-clock times (IANA name).
    report_timezone: str = "UTC"
    #: What a scheduled fleet report covers: traces ingested this long before it is due (``7d``); empty: all.
    report_window: str = "7d"
    #: How many scheduled fleet reports ``reports/`` keeps (the oldest go first).
    report_keep: int = 52

    @classmethod
    def of(cls, settings: Settings) -> ServerSettings:
        """``settings`` as server settings: a plain ``Settings`` gets the server's defaults (not the environment's)."""
        if isinstance(settings, cls):
            return settings
        return cls(**{f.name: getattr(settings, f.name) for f in dataclasses.fields(Settings)})


#: One line per server setting, for the docs (docs/api.md) and `--help` texts.
SERVER_SETTINGS_DOC: dict[str, str] = {
    "tokens": "API bearer tokens with scopes, `ci-uploader-7f3a:read,write;dashboard-9c2e:read` (scopes `read`, `write`, `admin`); "
    "none set: the server serves loopback only.",
    "tokens_file": "A file of API tokens, one `token:scopes` per line; read with `tokens`.",
    "max_file_bytes": "Largest file one upload may carry (default 4 GiB).",
    "max_request_bytes": "Largest upload request body, every file together (default 8 GiB).",
    "max_archive_members": "Most members an uploaded `.zip` or `.tar.gz` may hold (default 10,000).",
    "ingest_workers": "Processes `tracelake serve` ingests uploads with (default 1).",
    "upload_idle_timeout_seconds": "Seconds an upload's body may send nothing before the server cuts it off "
    "with a 408 (default 60).",
    "header_timeout_seconds": "Seconds a client has to send a request's headers before the server answers 408 and "
    "closes the connection (default 30).",
    "upload_deadline_seconds": "Seconds one upload may take from its first byte to its last, however steadily it "
    "sends (default 3600); past it the server answers 408.",
    "max_connections": "Connections the server holds open at once (default 1000, lowered to fit the open-file limit); "
    "past it the connection idle longest (no request in progress) is closed to make room.",
    "report_schedule": "When `tracelake serve` writes the fleet report into `$TRACELAKE_HOME/reports/`, in cron syntax "
    "(`0 6 * * MON`: Mondays at 06:00; `@daily`); empty (the default): never. A run missed while the server was "
    "down is made at start-up.",
    "report_timezone": "Time zone of the schedule's times, an IANA name like `Europe/Berlin` (default `UTC`).",
    "report_window": "What a scheduled fleet report covers: traces ingested this long before it is due "
    "(default `7d`; `30m`, `12h`, `2w` work too; empty: every trace).",
    "report_keep": "How many scheduled fleet reports `reports/` keeps, the oldest removed first (default 52).",
}


def render_doc() -> str:
    """The table of server settings that docs/api.md carries under "Server settings"."""
    lines = ["| setting | meaning |", "|---|---|"]
    lines += [f"| `TRACELAKE_{name.upper()}` | {doc} |" for name, doc in SERVER_SETTINGS_DOC.items()]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(render_doc(), end="")
