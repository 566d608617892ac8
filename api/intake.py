"""Checking an upload before it is queued: archives unpacked safely, gzip bounded, formats recognised.

Every check runs before anything is queued, so an upload with one bad file is
refused whole (a 4xx naming the file) and nothing of it reaches the warehouse.
"""

from __future__ import annotations

from tracelake import ingest
from tracelake.warehouse import InvalidArgument, Settings
from tracelake.warehouse.inputs import expand_inputs

from .archives import UnpackLimits, archive_kind, check_gzip, unpack
from .ingest_queue import QueuedFile
from .uploads import ReceivedFile


def check_upload(files: list[ReceivedFile], settings: Settings) -> list[QueuedFile]:
    """The trace files of an upload, checked and ready to queue, in upload order.

    An archive (``.zip``, ``.tar.gz``) is unpacked beside it and stands for the
    trace files found in it, named ``<archive>/<path in archive>``.

    Raises:
        TooLarge: an archive or gzip file expands past the limits (a bomb?).
        InvalidArgument: an archive holds unsafe members or no trace file.
        TraceFormatError: a file is damaged or in no format tracelake reads.
    """
    limits = UnpackLimits.from_settings(settings)
    queued: list[QueuedFile] = []
    for received in files:
        if archive_kind(received.path) is not None:
            queued += _unpacked(received, limits)
            continue
        if received.decoded_bytes is None:  # not decoded as it arrived (the sink hashes gzip whole, bounded)
            check_gzip(received.path, name=received.name, limits=limits)
        ingest.detect(received.path, received.name)
        queued.append(QueuedFile(received.trace_id, received.name, received.path))
    return queued


def _unpacked(received: ReceivedFile, limits: UnpackLimits) -> list[QueuedFile]:
    folder = received.path.with_name(received.path.name + ".d")
    folder.mkdir()
    unpack(received.path, folder, name=received.name, limits=limits)
    found = expand_inputs([folder])
    if not found:
        raise InvalidArgument(
            f"{received.name}: the archive holds no trace file (looked for *.json, *.json.gz, *.xplane.pb "
            "and NCCL logs / nccl-tests output)"
        )
    queued = []
    for path in found:
        name = f"{received.name}/{path.relative_to(folder).as_posix()}"
        ingest.detect(path, name)
        queued.append(QueuedFile(ingest.content_id(path, name), name, path))
    return queued
