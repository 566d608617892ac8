"""What a job name and a label key may be: checked where a person or a program gives one (the CLI, the API, the
client before it sends anything) and where the warehouse stores one. This module imports nothing of the project's
but its errors, so the client can check a name without the server's code."""

from __future__ import annotations

import re
from collections.abc import Mapping

from .errors import InvalidArgument

#: A job name: it names a folder of every table (``job=<name>``).
JOB_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
#: A label key (the faces parse ``key=value`` text into labels; docs/architecture.md).
LABEL_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,63}$")
#: The one job name the warehouse keeps for itself (the folder of the tables' schema files).
RESERVED_JOB = "_schema"


def check_job(job: str) -> str:
    """Return ``job`` if it is a valid job name, else raise :class:`InvalidArgument`."""
    if not isinstance(job, str) or not JOB_NAME.match(job) or job == RESERVED_JOB:
        raise InvalidArgument(
            f"invalid job name {job!r}: use letters, digits, '.', '_' or '-' "
            "(up to 128 characters, starting with a letter or digit)"
        )
    return job


def check_labels(labels: Mapping[str, object]) -> dict[str, str]:
    """``labels`` as strings, if every key is valid; else :class:`InvalidArgument` naming the first bad one."""
    checked: dict[str, str] = {}
    for key, value in labels.items():
        if not isinstance(key, str) or not LABEL_KEY.match(key):
            raise InvalidArgument(f"invalid label key {key!r}: use letters, digits, '_', '.' or '-' (up to 64 "
                                  "characters, starting with a letter or '_'), e.g. team=infra")
        checked[key] = str(value)
    return checked
