"""Parsing what a person types into the values the facade takes.

Labels (``--label key=value``, ``?label=``) and times (``--since 7d``, ``?until=2026-12-01``):
:meth:`Warehouse.fleet` takes datetimes; ``tracelake report fleet``, ``GET /api/v1/reports/fleet``
and the scheduled reports parse what they are given here first.
"""

from __future__ import annotations

import datetime as dt
import re

from tracelake.analysis.fleet_view import EARLIEST, LATEST, in_range
from tracelake.contracts.errors import InvalidArgument
from tracelake.warehouse.store import LABEL_KEY

__all__ = ["EARLIEST", "LATEST", "parse_labels", "parse_when"]

_RELATIVE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(m|min|h|d|w)\s*$", re.IGNORECASE)
_UNITS = {"m": "minutes", "min": "minutes", "h": "hours", "d": "days", "w": "weeks"}


def parse_labels(pairs: list[str] | None) -> dict[str, str]:
    """Turn ``["team=infra", "model=llama"]`` into a dict, with a clear error for bad pairs."""
    labels: dict[str, str] = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        key = key.strip()
        if not sep or not LABEL_KEY.match(key):
            raise InvalidArgument(f"invalid label {pair!r}: expected key=value, e.g. team=infra")
        labels[key] = value.strip()
    return labels


def parse_when(text: str, now: dt.datetime | None = None) -> dt.datetime:
    """A point in time from ``7d``, ``12h``, ``30m``, ``2w`` (that long before ``now``) or an ISO date/datetime.

    Dates and naive datetimes are UTC.

    Raises:
        InvalidArgument: neither form, or a time outside :data:`EARLIEST` to :data:`LATEST`.
    """
    now = now or dt.datetime.now(dt.timezone.utc)
    match = _RELATIVE.match(text)
    if match:
        amount, unit = float(match.group(1)), match.group(2).lower()
        try:
            return in_range(now - dt.timedelta(**{_UNITS[unit]: amount}), text)
        except OverflowError:
            raise InvalidArgument(f"invalid time {text!r}: too far back") from None
    try:
        moment = dt.datetime.fromisoformat(text.strip())
    except ValueError:
        raise InvalidArgument(
            f"invalid time {text!r}: give a duration back from now (30m, 12h, 7d, 2w) or an ISO date "
            "(2026-12-01, 2026-12-01T06:00:00Z)") from None
    return in_range(moment if moment.tzinfo is not None else moment.replace(tzinfo=dt.timezone.utc), text)
