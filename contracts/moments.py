"""The times a report window may name: from the Unix epoch to the last day nanosecond timestamps reach.

A contract of every layer: the API and CLI check what a person typed against it, the fleet's view
clamps its windows to it. Outside it there is nothing to report (``ts_ns`` is a signed 64-bit count of
nanoseconds since 1970), and date arithmetic on it (14 days of history) would overflow.
"""

from __future__ import annotations

import datetime as dt

from .errors import InvalidArgument

EARLIEST = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
LATEST = dt.datetime(2262, 4, 11, tzinfo=dt.UTC)


def in_range(moment: dt.datetime, text: str | None = None) -> dt.datetime:
    """``moment`` (naive: UTC) if it lies in ``[EARLIEST, LATEST]``.

    Raises:
        InvalidArgument: it does not; the message quotes ``text`` (what the user wrote) where given.
    """
    moment = moment if moment.tzinfo is not None else moment.replace(tzinfo=dt.UTC)
    if not EARLIEST <= moment <= LATEST:  # compares aware times without converting, which could overflow
        shown = repr(text) if text is not None else moment.isoformat()
        raise InvalidArgument(f"invalid time {shown}: out of range; give a time from {EARLIEST:%Y-%m-%d} to "
                              f"{LATEST:%Y-%m-%d} (UTC)")
    return moment
