"""PyTorch profiler integration: ``on_trace_ready=tracelake.torch.upload(job=...)`` (docs/integrations/pytorch.md).

::

    import torch, tracelake.torch

    with torch.profiler.profile(schedule=torch.profiler.schedule(wait=1, warmup=1, active=2, repeat=2),
                                on_trace_ready=tracelake.torch.upload(job="llama-70b", labels={"team": "infra"})) as prof:
        for batch in loader:
            train_step(batch)
            prof.step()

Each time the profiler has a trace (once per ``schedule`` cycle), the training thread exports it
to a temporary file and hands it over; gzipping and uploading happen on a background thread
(:class:`tracelake.client.BackgroundUploader`), and a trace the server does not take is kept in
the spool for ``tracelake push --spool``. The file is named ``rank-{rank}.{step}.pt.trace.json.gz``
and labelled ``rank`` and ``world_size``, from ``torch.distributed`` once it is initialised (else
from ``$RANK``/``$WORLD_SIZE``, as ``torchrun`` sets them, else 0 and 1). Torch itself is imported
only when a trace is ready.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tracelake.client.uploader import BackgroundUploader, flush, shared_uploader
from tracelake.contracts.names import check_job, check_labels

__all__ = ["TraceUploader", "flush", "upload"]

log = logging.getLogger(__name__)


class TraceUploader:
    """The ``on_trace_ready`` callback :func:`upload` makes: export on the caller's thread, send on the uploader's."""

    def __init__(self, uploader: BackgroundUploader, job: str, labels: Mapping[str, str]) -> None:
        self.uploader = uploader
        self.job = job
        self.labels = {str(k): str(v) for k, v in labels.items()}
        #: Traces handed over so far.
        self.handed = 0

    def __repr__(self) -> str:
        return f"TraceUploader(job={self.job!r}, {self.uploader!r})"

    def __call__(self, prof: Any) -> None:
        """Export ``prof``'s trace and hand it to the uploader; logs, never raises, whatever goes wrong."""
        try:
            rank, world_size = process_rank()
            step = int(getattr(prof, "step_num", self.handed))
            raw = self.uploader.staging() / f"{uuid.uuid4().hex}.pt.trace.json"
            prof.export_chrome_trace(str(raw))
            self.uploader.submit(raw, job=self.job, labels={**self.labels, "rank": str(rank), "world_size":
                                 str(world_size)}, gzip_as=f"rank-{rank}.{step}.pt.trace.json.gz", owned=True)
            self.handed += 1
        except Exception:  # a profiler hook must never stop training
            log.exception("could not hand the profiler's trace to tracelake; training goes on")

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until the traces handed over are sent or spooled; False if ``timeout`` seconds ran out first."""
        return self.uploader.flush(timeout)


def upload(job: str = "default", labels: Mapping[str, str] | None = None, *, url: str | None = None,
           token: str | None = None, spool: str | Path | None = None, retries: int = 3) -> TraceUploader:
    """An ``on_trace_ready`` callback for ``torch.profiler.profile`` that uploads each trace to a tracelake server.

    Args:
        job: The job to file the traces under.
        labels: ``key=value`` labels for every trace (``rank`` and ``world_size`` are added).
        url: The server (default ``$TRACELAKE_URL``, else ``http://127.0.0.1:8000``).
        token: A token with the ``write`` scope (default ``$TRACELAKE_TOKEN``).
        spool: Where traces the server does not take are kept (default ``$TRACELAKE_SPOOL``, else
            ``~/.cache/tracelake/spool``); ``tracelake push --spool`` sends them later.
        retries: Tries again per request before a trace is spooled.

    Raises:
        InvalidArgument: ``job`` or a label key is not valid (contracts/names.py): at setup, not at the upload.

    Returns:
        The callback; its ``flush(timeout)`` waits for the traces handed over (at exit this happens by itself).
    """
    check_job(job)  # a bad name fails here, when the profiler is set up, not as spooled traces later
    return TraceUploader(shared_uploader(url, token, spool, retries), job, check_labels(labels or {}))


def process_rank() -> tuple[int, int]:
    """This process's rank and world size: ``torch.distributed``'s when initialised, else ``$RANK``/``$WORLD_SIZE``."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    try:
        return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        return 0, 1
