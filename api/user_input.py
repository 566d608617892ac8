"""Parsing what a person types into the values the facade takes.

Labels (``--label key=value``, ``?label=``) and times (``--since 7d``, ``?until=2026-12-01``):
:meth:`Warehouse.fleet` takes datetimes; ``tracelake report fleet``, ``GET /api/v1/reports/fleet``
and the scheduled reports parse what they are given here first.
"""

from __future__ import annotations

import datetime as dt
import re

from tracelake.contracts.critical import SPEEDUP_CATEGORIES, Speedup
from tracelake.contracts.errors import InvalidArgument
from tracelake.contracts.moments import EARLIEST, LATEST, in_range
from tracelake.contracts.names import LABEL_KEY

__all__ = ["EARLIEST", "LATEST", "parse_labels", "parse_speedups", "parse_when"]

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


#: What a speedup's target may hold: a category, or a name pattern of letters, digits and ``_*?.:<>,-``.
_TARGET = re.compile(r"^[A-Za-z0-9_*?.:<>,\-]{1,200}$")
#: The most speedups one analysis replays, and the largest factor.
MAX_SPEEDUPS, MAX_FACTOR = 8, 1000.0


def parse_speedups(texts: list[str] | None) -> tuple[Speedup, ...]:
    """``["gemm*=2", "communication=1.5"]`` -> what-if speedups (``TARGET=FACTOR``: a category, or a pattern of
    op names, that many times as fast), with a clear error for bad ones."""
    out: list[Speedup] = []
    for text in texts or []:
        target, sep, factor = text.rpartition("=")
        target = target.strip()
        example = f"e.g. compute=1.5 or 'gemm*=2' (a category: {', '.join(SPEEDUP_CATEGORIES)}; or op names, * and ?)"
        if not sep or not _TARGET.match(target):
            raise InvalidArgument(f"invalid what-if {text!r}: expected TARGET=FACTOR, {example}")
        try:
            value = float(factor)
        except ValueError:
            raise InvalidArgument(f"invalid what-if {text!r}: {factor.strip()!r} is not a number; {example}") from None
        if not 0 < value <= MAX_FACTOR:
            raise InvalidArgument(f"invalid what-if {text!r}: the factor must be above 0 and at most {MAX_FACTOR:g}")
        out.append(Speedup(target, value))
    if len(out) > MAX_SPEEDUPS:
        raise InvalidArgument(f"at most {MAX_SPEEDUPS} what-ifs at once, not {len(out)}")
    return tuple(dict.fromkeys(out))


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
