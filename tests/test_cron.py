"""Cron schedules: parsing, errors, and the run times before and after a moment (UTC and local zones)."""

from __future__ import annotations

import datetime as dt

import pytest

from tracelake.api.cron import Cron
from tracelake.contracts.errors import InvalidArgument

UTC = dt.timezone.utc


def at(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text).replace(tzinfo=UTC)


def test_weekly_on_monday_morning() -> None:
    cron = Cron.parse("0 6 * * MON")
    # 2026-12-03 is a Thursday: the next Monday is the 7th, the previous one the 30th of November
    assert cron.next_after(at("2026-12-03T01:00:00")) == at("2026-12-07T06:00:00")
    assert cron.previous(at("2026-12-03T01:00:00")) == at("2026-11-30T06:00:00")
    # strictly after, at or before
    assert cron.next_after(at("2026-12-07T06:00:00")) == at("2026-12-14T06:00:00")
    assert cron.previous(at("2026-12-07T06:00:00")) == at("2026-12-07T06:00:00")
    assert cron.previous(at("2026-12-07T05:59:59")) == at("2026-11-30T06:00:00")


@pytest.mark.parametrize(("expression", "same_as"), [
    ("@weekly", "0 0 * * 0"), ("@daily", "0 0 * * *"), ("@midnight", "0 0 * * *"), ("@hourly", "0 * * * *"),
    ("@monthly", "0 0 1 * *"), ("@yearly", "0 0 1 1 *"), ("@annually", "0 0 1 1 *"),
    ("0 6 * * 7", "0 6 * * 0"), ("0 6 * * sun", "0 6 * * 0"), ("0 6 * jan-mar mon-fri", "0 6 * 1-3 1-5"),
    ("*/15 * * * *", "0,15,30,45 * * * *"), ("5/20 * * * *", "5,25,45 * * * *"), ("0 8-18/5 * * *", "0 8,13,18 * * *"),
])
def test_equivalent_forms(expression: str, same_as: str) -> None:
    a, b = Cron.parse(expression), Cron.parse(same_as)
    moment = at("2026-12-03T01:02:03")
    for _ in range(20):  # the same next twenty runs
        na, nb = a.next_after(moment), b.next_after(moment)
        assert na == nb and na is not None
        moment = na


def test_every_quarter_hour_in_working_hours() -> None:
    cron = Cron.parse("*/15 9-17 * * MON-FRI")
    assert cron.next_after(at("2026-12-04T17:45:00")) == at("2026-12-07T09:00:00")  # Friday evening -> Monday 9:00
    assert cron.next_after(at("2026-12-07T09:07:00")) == at("2026-12-07T09:15:00")
    assert cron.previous(at("2026-12-06T12:00:00")) == at("2026-12-04T17:45:00")  # Sunday -> Friday's last run


def test_day_of_month_or_day_of_week_when_both_are_given() -> None:
    # crontab(5): the 13th of a month OR a Friday
    cron = Cron.parse("0 0 13 * FRI")
    runs = []
    moment = at("2026-11-30T00:00:00")
    for _ in range(5):
        moment = cron.next_after(moment)  # type: ignore[assignment]
        runs.append(moment.date().isoformat())
    assert runs == ["2026-12-04", "2026-12-11", "2026-12-13", "2026-12-18", "2026-12-25"]


def test_across_the_year_and_leap_days() -> None:
    assert Cron.parse("0 0 1 1 *").next_after(at("2026-12-31T23:59:00")) == at("2027-01-01T00:00:00")
    assert Cron.parse("30 12 29 2 *").next_after(at("2026-03-01T00:00:00")) == at("2028-02-29T12:30:00")


def test_a_local_time_zone_follows_daylight_saving() -> None:
    cron = Cron.parse("0 6 * * *", "Europe/Berlin")
    # CET (UTC+1) before 2026-03-29, CEST (UTC+2) after
    assert cron.next_after(at("2026-03-28T12:00:00")) == at("2026-03-29T04:00:00")
    assert cron.next_after(at("2026-03-27T12:00:00")) == at("2026-03-28T05:00:00")
    # a wall-clock time the change skips (02:30 on 2026-03-29) still runs that day, an hour later
    skipped = Cron.parse("30 2 * * *", "Europe/Berlin")
    assert skipped.next_after(at("2026-03-28T12:00:00")) == at("2026-03-29T01:30:00")


@pytest.mark.parametrize(("expression", "message"), [
    ("0 6 * *", "needs 5 fields"),
    ("0 6 * * * *", "needs 5 fields"),
    ("60 6 * * *", "minute 60 is outside 0-59"),
    ("0 24 * * *", "hour 24 is outside 0-23"),
    ("0 6 0 * *", "day of month 0 is outside 1-31"),
    ("0 6 * 13 *", "month 13 is outside 1-12"),
    ("0 6 * * 8", "day of week 8 is outside 0-7"),
    ("0 6 * * FOO", "day of week 'FOO' is not a number or a name like SUN"),
    ("0 6 * FOO *", "month 'FOO' is not a number or a name like JAN"),
    ("x 6 * * *", "minute 'x' is not a number"),
    ("0 18-8 * * *", "hour range '18-8' runs backwards"),
    ("*/0 * * * *", "minute 0 is outside 1-60"),
    ("0 0 30 2 *", "never runs"),
    ("@fortnightly", "the shortcuts are @hourly, @daily, @weekly, @monthly and @yearly"),
])
def test_bad_schedules_say_what_is_wrong(expression: str, message: str) -> None:
    with pytest.raises(InvalidArgument) as error:
        Cron.parse(expression)
    assert message in str(error.value)
    assert repr(expression) in str(error.value)


def test_unknown_time_zone() -> None:
    with pytest.raises(InvalidArgument, match="unknown time zone 'Mars/Olympus'"):
        Cron.parse("0 6 * * *", "Mars/Olympus")


def test_naive_times_are_utc() -> None:
    cron = Cron.parse("@hourly")
    assert cron.next_after(dt.datetime(2026, 12, 3, 1, 30)) == at("2026-12-03T02:00:00")
