"""The tracelake client: upload traces from a training job, CI or a shell, and read analyses back.

It imports only the standard library and :mod:`tracelake.contracts` (polars inside the methods
that answer frames, ISA-L when it is there), never the server, DuckDB or the warehouse, so a
training job can import it cheaply (docs/integrations.md)::

    from tracelake.client import Client

    client = Client()                       # TRACELAKE_URL, TRACELAKE_TOKEN
    report = client.upload("runs/42/", job="llama-70b", labels={"team": "infra"}, wait=True)

The profiler hooks build on it: ``tracelake.torch.upload(...)`` (docs/integrations/pytorch.md)
and ``tracelake.jax.trace(...)`` (docs/integrations/jax.md) upload from a background thread
(:mod:`tracelake.client.uploader`) and keep what cannot be sent in a spool folder
(:mod:`tracelake.client.spool`) for ``tracelake push --spool``.
"""

from __future__ import annotations

from tracelake.contracts.errors import ServerError

from .core import Client, Sent, UploadProgress, UploadReport
from .files import content_id, trace_files
from .spool import SpoolReport, default_spool, send_spool
from .uploader import BackgroundUploader, flush

__all__ = ["BackgroundUploader", "Client", "Sent", "ServerError", "SpoolReport", "UploadProgress", "UploadReport",
           "content_id", "default_spool", "flush", "send_spool", "trace_files"]
