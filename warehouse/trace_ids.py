"""Trace ids as people type them: a whole id or a unique prefix of one, as git takes commit hashes.

:func:`.selection.of` and :func:`.selection.resolve` go through :func:`resolve`, so every
face (``tracelake analyze TRACE``, ``diff``, ``GET /api/v1/traces/{id}``, ...) takes prefixes alike.
A prefix must have at least :data:`MIN_PREFIX` characters; one that several traces share is refused
with the candidates named (README, "Using it").
"""

from __future__ import annotations

import itertools
import re

from tracelake.contracts.errors import InvalidArgument

from .store import SCHEMA_JOB, Store

#: The fewest characters a trace id prefix may have (as git's shortest abbreviation).
MIN_PREFIX = 4
#: Candidates an ambiguity error names at most.
SHOWN_CANDIDATES = 8
#: Id characters ``tracelake traces`` shows at the least on a narrow terminal (unique prefixes, longer when needed).
SHORT_ID = 12
_HEX = re.compile(r"^[0-9a-f]{1,64}$")


class AmbiguousTraceId(InvalidArgument):
    """A trace id prefix that more than one trace starts with."""


def resolve(store: Store, text: str) -> tuple[str, str] | None:
    """The ``(job, trace_id)`` that ``text`` names: a registered id, else the one id it is a prefix of.

    Returns None when ``text`` is no trace id nor a prefix of one (so a caller may try it as a job).

    Raises:
        AmbiguousTraceId: ``text`` is a prefix of more than one trace id.
    """
    if not _HEX.match(text):
        return None
    job = store.registered_job(text)
    if job is not None:
        return job, text
    if len(text) < MIN_PREFIX:
        return None
    matches = sorted({(p.stem, p.parent.name.partition("=")[2])
                      for p in (store.tables / "traces").glob(f"job=*/{text}*.parquet")
                      if p.parent.name != f"job={SCHEMA_JOB}"})
    if len(matches) > 1:
        shown = ", ".join(f"{trace_id} (job {job})" for trace_id, job in matches[:SHOWN_CANDIDATES])
        more = f" and {len(matches) - SHOWN_CANDIDATES} more" if len(matches) > SHOWN_CANDIDATES else ""
        raise AmbiguousTraceId(f"trace id prefix {text!r} is ambiguous: {len(matches)} traces start with it: "
                               f"{shown}{more}; give more characters")
    if matches:
        trace_id, job = matches[0]
        return job, trace_id
    return None


def not_found_hint(text: str) -> str:
    """What to add to "no trace with id ..." when ``text`` is too short to be taken as a prefix."""
    if _HEX.match(text) and len(text) < MIN_PREFIX:
        return f" (a trace id prefix needs at least {MIN_PREFIX} characters)"
    return ""


def short_ids(ids: list[str], everyone: list[str], minimum: int = SHORT_ID) -> int:
    """How many leading characters keep each of ``ids`` apart from every other id in ``everyone`` (at least
    ``minimum``)."""
    ordered = sorted(set(everyone) | set(ids))
    wanted = set(ids)
    length = minimum
    for left, right in itertools.pairwise(ordered):
        if left in wanted or right in wanted:
            common = 0
            for a, b in zip(left, right):
                if a != b:
                    break
                common += 1
            length = max(length, common + 1)
    return length
