"""The ``tracelake`` command: a thin adapter over :class:`tracelake.warehouse.Warehouse`, a module per verb.

:mod:`.root` holds the command group (:data:`app`), the options the commands share and the one
place that maps :class:`TracelakeError` to a message and an exit code. Importing a verb's module
registers its command; they are imported here in the order ``tracelake --help`` lists them.
"""

from __future__ import annotations

from .root import app

# Importing a verb's module registers its commands: `tracelake --help` lists them in this order.
from . import ingest, push, traces, sql, analyze, diff, demo, serve, report, export, admin, nccl_env  # noqa: F401,E402  # isort: skip

__all__ = ["app", "main"]


def main() -> None:
    """Entry point of the ``tracelake`` console script."""
    app()
