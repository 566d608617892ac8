"""``tracelake serve``: the REST API under uvicorn."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from tracelake.warehouse import InvalidArgument

from ..settings import ServerSettings

from .root import HomeOption, app, err_console, exit_on_error


@app.command()
@exit_on_error
def serve(
    home: HomeOption = None,
    host: Annotated[str, typer.Option(help="Address to listen on. Anything but loopback needs API tokens.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.", min=1, max=65535)] = 8000,
    tokens_file: Annotated[Path | None, typer.Option(
        "--tokens-file", envvar="TRACELAKE_TOKENS_FILE", show_default=False,
        help="File of API tokens, one `token:read,write` per line (also: TRACELAKE_TOKENS).")] = None,
    ingest_workers: Annotated[int | None, typer.Option(
        "--ingest-workers", min=0, show_default=False,
        help="Processes that ingest uploads (default 1; 0 ingests on a thread of the server).")] = None,
) -> None:
    """Serve the REST API (uploads, ingest status, analyses, SQL) with uvicorn; docs at /docs."""
    import uvicorn

    from ..app import create_app
    from ..auth import Tokens
    from ..connections import fit_open_files, guarded_h11_protocol
    from ..network import is_loopback

    settings = ServerSettings.from_env(home=home, tokens_file=str(tokens_file) if tokens_file else None,
                                       ingest_workers=ingest_workers)
    if not Tokens.from_settings(settings).configured:
        if not is_loopback(host):
            raise InvalidArgument(
                f"refusing to serve on {host} without API tokens: anyone who can reach it could read and "
                "write the warehouse. Set TRACELAKE_TOKENS=\"<token>:read,write\" (or --tokens-file), "
                "or serve on 127.0.0.1"
            )
        err_console.print("[yellow]no API tokens configured:[/] serving on loopback only; "
                          "every local user can read and write the warehouse", highlight=False)
    budget = fit_open_files(settings.max_connections)
    application = create_app(settings)
    err_console.print(f"tracelake {escape(str(settings.home_path))} on http://{escape(host)}:{port} "
                      f"(API docs: http://{escape(host)}:{port}/docs)", highlight=False)
    err_console.print(escape(budget.describe()), highlight=False)
    # h11 with deadlines for request heads and silent bodies, no reading of abandoned bodies and at most
    # max_connections open, the idle longest closed first (see api/connections.py); headers larger than 16 KiB
    # are refused with a 400 by h11 itself. No WebSocket route exists: upgrades are not offered.
    uvicorn.run(application, host=host, port=port, log_level="info", timeout_graceful_shutdown=10,
                http=guarded_h11_protocol(settings.header_timeout_seconds, settings.upload_idle_timeout_seconds,
                                          budget.max_connections),
                limit_concurrency=budget.limit_concurrency, ws="none", timeout_keep_alive=5,
                h11_max_incomplete_event_size=16 << 10)
