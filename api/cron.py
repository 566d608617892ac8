"""Cron schedules (``0 6 * * MON``): parse one, and find the run times around a moment.

The five fields of crontab(5): minute, hour, day of month, month, day of week, each
``*``, a number, a range ``a-b``, a list ``a,b`` or a step ``*/n`` / ``a-b/n``; months
and days of week also by name (``JAN``, ``MON``); Sunday is 0 or 7. As in cron, when
both the day of month and the day of week are restricted, a day matching either one
runs. ``@hourly``, ``@daily`` (``@midnight``), ``@weekly``, ``@monthly`` and ``@yearly``
(``@annually``) are accepted too. Times are wall-clock times in the schedule's time zone.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from tracelake.contracts.errors import InvalidArgument

_ALIASES = {
    "@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *", "@monthly": "0 0 1 * *", "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *", "@midnight": "0 0 * * *", "@hourly": "0 * * * *",
}
_MONTHS = {name: i for i, name in enumerate(
    ["JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"], start=1)}
_DAYS = {name: i for i, name in enumerate(["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"])}
#: (name, lowest, highest, names) of each field.
_FIELDS: tuple[tuple[str, int, int, dict[str, int]], ...] = (
    ("minute", 0, 59, {}),
    ("hour", 0, 23, {}),
    ("day of month", 1, 31, {}),
    ("month", 1, 12, _MONTHS),
    ("day of week", 0, 7, _DAYS),
)
#: How far to look for the next or previous run before calling a schedule one that never runs.
_HORIZON_DAYS = 366 * 5


@dataclass(frozen=True)
class Cron:
    """A parsed cron schedule in a time zone; :meth:`parse` builds one."""

    expression: str
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]  # 0 = Monday, as datetime.weekday()
    any_day: bool  # day of month is "*"
    any_weekday: bool  # day of week is "*"
    zone: dt.tzinfo = field(default=dt.timezone.utc)

    @classmethod
    def parse(cls, expression: str, timezone: str = "UTC") -> Cron:
        """Parse ``expression`` (five fields or an ``@`` alias) with wall-clock times in ``timezone``.

        Raises:
            InvalidArgument: the expression or the time zone is not valid, or the schedule never runs.
        """
        text = " ".join(expression.split())
        if text.startswith("@") and text.lower() not in _ALIASES:
            raise InvalidArgument(f"invalid cron schedule {expression!r}: the shortcuts are @hourly, @daily, "
                                  "@weekly, @monthly and @yearly")
        fields_text = _ALIASES.get(text.lower(), text).split(" ")
        if len(fields_text) != 5:
            raise InvalidArgument(
                f"invalid cron schedule {expression!r}: it needs 5 fields (minute hour day-of-month month "
                "day-of-week), e.g. '0 6 * * MON', or @daily / @weekly")
        values = [_field(expression, text_, *spec) for text_, spec in zip(fields_text, _FIELDS)]
        weekdays = frozenset((day - 1) % 7 for day in values[4])  # cron 0/7 = Sunday -> 6, 1 = Monday -> 0
        cron = cls(
            expression=text,
            minutes=tuple(sorted(values[0])),
            hours=tuple(sorted(values[1])),
            days=frozenset(values[2]),
            months=frozenset(values[3]),
            weekdays=weekdays,
            any_day=fields_text[2] == "*",
            any_weekday=fields_text[4] == "*",
            zone=_zone(timezone),
        )
        if cron.next_after(dt.datetime(2000, 1, 1, tzinfo=dt.timezone.utc)) is None:
            raise InvalidArgument(f"cron schedule {expression!r} never runs (no such date)")
        return cron

    def runs_on(self, day: dt.date) -> bool:
        """Whether the schedule runs on ``day`` (a date in its time zone)."""
        if day.month not in self.months:
            return False
        by_day = day.day in self.days
        by_weekday = day.weekday() in self.weekdays
        if self.any_day and self.any_weekday:
            return True
        if self.any_day:
            return by_weekday
        if self.any_weekday:
            return by_day
        return by_day or by_weekday

    def next_after(self, moment: dt.datetime) -> dt.datetime | None:
        """The first run strictly after ``moment`` (UTC), or None within five years."""
        moment = _aware(moment)
        local = moment.astimezone(self.zone)
        day = local.date()
        for _ in range(_HORIZON_DAYS):
            if self.runs_on(day):
                for when in self._times(day):
                    if when > moment:
                        return when
            day += dt.timedelta(days=1)
        return None

    def previous(self, moment: dt.datetime) -> dt.datetime | None:
        """The last run at or before ``moment`` (UTC), or None within five years."""
        moment = _aware(moment)
        day = moment.astimezone(self.zone).date()
        for _ in range(_HORIZON_DAYS):
            if self.runs_on(day):
                for when in reversed(self._times(day)):
                    if when <= moment:
                        return when
            day -= dt.timedelta(days=1)
        return None

    def _times(self, day: dt.date) -> list[dt.datetime]:
        """The day's run times in UTC, in order (a wall-clock time skipped by a DST change runs an hour later)."""
        times = []
        for hour in self.hours:
            for minute in self.minutes:
                local = dt.datetime(day.year, day.month, day.day, hour, minute, tzinfo=self.zone)
                times.append(local.astimezone(dt.timezone.utc))
        return sorted(set(times))


def _field(expression: str, text: str, name: str, low: int, high: int, names: dict[str, int]) -> set[int]:
    values: set[int] = set()
    for item in text.split(","):
        body, _, step_text = item.partition("/")
        step = _number(expression, name, step_text, 1, high - low + 1, {}) if step_text else 1
        if body == "*":
            first, last = low, high
        elif "-" in body:
            start, _, end = body.partition("-")
            first, last = (_number(expression, name, part, low, high, names) for part in (start, end))
            if first > last:
                raise InvalidArgument(f"invalid cron schedule {expression!r}: {name} range {body!r} runs backwards")
        else:
            first = _number(expression, name, body, low, high, names)
            last = high if step_text else first
        values.update(range(first, last + 1, step))
    return values


def _number(expression: str, name: str, text: str, low: int, high: int, names: dict[str, int]) -> int:
    upper = text.strip().upper()
    if upper in names:
        return names[upper]
    if not upper.isdigit():
        hint = f" or a name like {next(iter(names))}" if names else ""
        raise InvalidArgument(f"invalid cron schedule {expression!r}: {name} {text!r} is not a number{hint}")
    value = int(upper)
    if not low <= value <= high:
        raise InvalidArgument(f"invalid cron schedule {expression!r}: {name} {value} is outside {low}-{high}")
    return value


def _zone(name: str) -> dt.tzinfo:
    if name.upper() in ("UTC", "Z", ""):
        return dt.timezone.utc
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise InvalidArgument(f"unknown time zone {name!r}: give an IANA name like Europe/Berlin, or UTC") from None


def _aware(moment: dt.datetime) -> dt.datetime:
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=dt.timezone.utc)
