"""The states a trace goes through, as enums every layer shares.

Two questions have two enums: what became of one input file in one ``ingest`` call
(:class:`IngestStatus`, ``IngestResult.status``), and where an upload the API queued
stands (:class:`TaskStatus`, the ``status`` of ``/traces`` answers). The values are the
strings stored and sent, so a member compares equal to its string.
"""

from __future__ import annotations

from enum import StrEnum


class IngestStatus(StrEnum):
    """What became of one input file in one ``ingest`` call."""

    #: Parsed into the staging area, not yet published (internal: never returned to callers).
    STAGED = "staged"
    #: Published: its rows are visible in every table.
    INGESTED = "ingested"
    #: The same content was already in the warehouse; nothing was written.
    DUPLICATE = "duplicate"
    #: It could not be ingested; ``IngestResult.error`` says why.
    FAILED = "failed"


#: The ingest statuses callers see (``STAGED`` never leaves the warehouse).
FINAL_INGEST_STATUSES: tuple[IngestStatus, ...] = (IngestStatus.INGESTED, IngestStatus.DUPLICATE, IngestStatus.FAILED)


class TaskStatus(StrEnum):
    """Where an upload the API accepted stands in its ingest queue."""

    QUEUED = "queued"
    INGESTING = "ingesting"
    DONE = "done"
    FAILED = "failed"
